"""Bench: what the ranks' agreement costs, measured side by side in one run on 2 gloo ranks.

- `RankVote.check` (the gathers' hot path: one all-reduce of the failure flag and the call's tag, 72 bytes) against
  its physical limit, one raw all-reduce of the same 72 bytes, and against the 4-byte all-reduce of the flag alone
  that it replaced (the tag's cost: the difference);
- one store-based stage (`RankVote.agree`: post, then poll until every rank arrived), as `save_lora` and `load_lora`
  run three or four of them, against one store round trip (`Store.add`).
Medians of `--runs` calls, the slowest rank's. Run: `python bench/votes.py [--runs 2000]`.
"""
from __future__ import annotations

import argparse, statistics, time

import torch
import torch.distributed as dist

from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.gather.votes import RankVote

def timed(fns:dict, runs:int)->dict[str, float]:
    """Median seconds per call of each of `fns`, the slowest rank's; interleaved (call i of every function, then call
    i+1), so that on a shared machine the ratios compare calls made under the same load."""
    out = {k: [] for k in fns}
    for _ in range(runs):
        for k, fn in fns.items():
            dist.barrier(); t0 = time.perf_counter(); fn(); dt = time.perf_counter() - t0
            t = torch.tensor([dt], dtype=torch.float64); dist.all_reduce(t, op=dist.ReduceOp.MAX)
            out[k].append(t.item())
    return {k: statistics.median(v) for k, v in out.items()}

def rank_fn(runs:int)->dict:
    flag, tags = torch.zeros(1, dtype=torch.int32), torch.zeros(9, dtype=torch.int64)
    store = dist.distributed_c10d._get_default_store()
    vote = RankVote("bench")
    stages = iter(range(10**9))
    def agree():
        with RankVote("bench-agree") as v: v.agree("s")
    res = timed(dict(flag=lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX),
                     raw=lambda: dist.all_reduce(tags, op=dist.ReduceOp.MAX),
                     check=lambda: vote.check(f"collective {next(stages) % 4}"),
                     store=lambda: store.add("bench/rt", 1)), runs)
    res.update(timed(dict(agree=agree), max(50, runs // 10)))
    store.delete_key("bench/rt")
    return res

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2000)
    a = ap.parse_args()
    r = launch(rank_fn, a.runs, nprocs=2, quiet=True, timeout=600)[0]
    us = lambda s: f"{s * 1e6:8.1f} us"
    print(f"2 gloo ranks, medians of {a.runs} calls (agree: {max(50, a.runs // 10)}), the slowest rank's")
    print(f"check (flag + tag, 72 B all-reduce) {us(r['check'])}   raw 72 B all-reduce {us(r['raw'])}   "
          f"ratio {r['check'] / r['raw']:.2f}")
    print(f"the 4 B flag all-reduce it replaced  {us(r['flag'])}   the tag's cost {us(r['raw'] - r['flag'])}")
    print(f"one store stage (agree)             {us(r['agree'])}   one store round trip {us(r['store'])}   "
          f"ratio {r['agree'] / r['store']:.1f}")

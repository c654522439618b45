"""Bench: `gather_lora` and `save_lora` against their physical limit, measured side by side in one run on gloo ranks.

For each model (a 24-layer llama, hidden 256, and a 12-layer Qwen3-Omni thinker; LoRA r=8 on q/k/v/o) and each
sharding (FSDP1 with LoRA leaves as units, FSDP1 with decoder layers as units, FSDP2, and at 4 ranks hybrid sharding
2 x 2 with FSDP1 and FSDP2) it times, as the median of `--runs` runs after a warm-up (the slowest rank's time):
- `gather_lora(model)`;
- the limit: one raw `all_gather_into_tensor` of the same bytes (each rank's packed LoRA pieces, padded to the largest)
  plus the copies around it (packing this rank's bytes into the send buffer, copying the received bytes out);
- `save_lora(model, dir)`, against the limit plus rank 0 writing the same tensors with safetensors.
It prints each time as a ratio to its limit (goal: <= 3x; `-vote`: the gather's ratio less its failure check, what
a gather of one collective could at best reach), a raw `all_to_all_single` of the exact sizes (what
the kit uses when pieces are uneven), the failure check of one gather alone (one 72-byte all-reduce of the failure
flag and the ranks' call tags; included in the gather's time), the collectives and bytes of one gather, and the peak
extra memory of one gather (torch's MemTracker) against the bound: send buffer + receive buffer + the full LoRA
tensors (all made before the collective) + the check's 72 bytes.
`--profile` prints cProfile's top functions of one (second) gather on rank 0. `--strategies` runs the older
comparison of gather strategies (per unit, per tensor, whole model). Timings are noisy on a shared machine.

Measured 2026-12-02, `--runs 7`, 2 cores shared with other work (load average 0.2-4.5 over three runs): 8, 11 and
12 of the 16 gathers within 3x their limit; every peak within its bound. Four thinker cases (180 KiB of LoRA in 108
tensors) miss in every run: 2 ranks FSDP1 leaves (4.9-5.7x) and FSDP2 (4.6-5.8x), 4 ranks FSDP2 (3.0-3.9x) and FSDP2
hybrid (3.2-4.7x). Their limit is 0.4-0.9 ms at 2 ranks; a gather makes two collectives (the failure check, then the
data) and does rank-side work that takes 0.3 ms on an idle core (the engine's look-up, 108 pieces read in, 108 tensors
out: unbinding 108 views alone takes 0.08 ms) and 1-1.5 ms between two collectives here. With a free check the 2-rank
ones would still be at 3.8-5x (`-vote`), the 4-rank ones at 2.3-3.9x. The check is not carried inside the data
collective: under gloo an all-gather whose ranks pass unequal sizes aborts the process (SIGABRT), and one met by
another rank's all-reduce times out and leaves the group unusable, so ranks at different calls (what the check's tags
catch) must first meet in a collective whose size is the same for every call. On this machine a raw
`all_to_all_single` of the same bytes beats the raw all-gather in most cases (the `a2a` column), but the kit would
then send from a buffer of world copies of this rank's pieces (what it does only for uneven pieces).
Run: `python bench/gather.py [--ranks 2 4] [--models llama thinker] [--runs 15] [--profile]`.
"""
from __future__ import annotations

import argparse, contextlib, cProfile, io, json, os, pstats, shutil, statistics, sys, tempfile, time

import torch
import torch.distributed as dist

from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.models import add_lora, model_from_config, shipped_config
from lora_fsdp_kit.units import fmt_bytes

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
SETTINGS = {  # name: (testing.case_wrap policy, setting, sharding, ranks it runs at)
    "fsdp1_leaves": ("peft", "fsdp1", None, (2, 4)),          # peft's policy: every lora_A/lora_B its own unit
    "fsdp1_layers": ("layer", "fsdp1-orig", None, (2, 4)),    # decoder layers as units, use_orig_params=True
    "fsdp2": ("layer", "fsdp2", None, (2, 4)),                # fully_shard on decoder layers, then the root
    "fsdp1_hybrid": ("layer", "fsdp1-orig", "HYBRID_SHARD", (4,)),   # 2 x 2: shard groups of 2, replicated twice
    "fsdp2_hybrid": ("layer", "fsdp2", "HYBRID", (4,)),
}

def bench_model(name:str):
    "The 24-layer llama (hidden 256) or the 12-layer Qwen3-Omni thinker, LoRA r=8 on q/k/v/o."
    if name == "llama":
        cfg = dict(shipped_config("llama"), num_hidden_layers=24, hidden_size=256, intermediate_size=512,
                   head_dim=64, num_attention_heads=4, num_key_value_heads=2)
    else:
        cfg = shipped_config("qwen3_omni_thinker")
        cfg = dict(cfg, text_config=dict(cfg["text_config"], num_hidden_layers=12))
    return add_lora(model_from_config(cfg, device="cpu"), r=8)

def _slowest(seconds:float)->float:
    t = torch.tensor([seconds], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()

def timed(fns:dict, runs:int)->dict[str, list[float]]:
    """Seconds per call of each of `fns`, each the slowest rank's, after one warm-up call each; interleaved (run i of
    every function, then run i+1), so that on a shared machine each ratio compares calls made under the same load."""
    out = {k: [] for k in fns}
    for i in range(runs + 1):
        for k, fn in fns.items():
            dist.barrier()
            t0 = time.perf_counter(); fn()
            dt = _slowest(time.perf_counter() - t0)
            if i: out[k].append(dt)
    return out

def _meter():
    "The kit's meter and collective counter (in `measure` once the instruments move there, else in `memory`)."
    try: from lora_fsdp_kit import measure as m; m.measure_gather
    except (ImportError, AttributeError): from lora_fsdp_kit import memory as m
    return m.measure_gather, m.AllGatherCounter

def raw_limit(fm)->tuple:
    "The same bytes as one packed gather, moved by one raw all-gather: (collective only, with the copies, sizes)."
    from lora_fsdp_kit.gather import gather_engine
    eng = gather_engine(fm)
    names = list(dict.fromkeys(eng.primary(n) for n in eng.lora_names()))
    shards = [t for t in eng.shards(names) if t.group is not None]
    group = shards[0].group
    world, me = dist.get_world_size(group), dist.get_rank(group)
    sizes = [sum(t.piece_bytes(r) for t in shards) for r in range(world)]
    width, total = max(sizes), sum(sizes)
    src = torch.randint(0, 255, (sizes[me],), dtype=torch.uint8)
    send, recv = torch.empty(width, dtype=torch.uint8), torch.empty(world * width, dtype=torch.uint8)
    out = torch.empty(total, dtype=torch.uint8)
    collective = lambda: dist.all_gather_into_tensor(recv, send, group=group)
    # the exact-size exchange the kit uses when pieces are uneven (FSDP1 decoder-layer units), for reference
    a2a_send, a2a_recv = torch.empty(world * sizes[me], dtype=torch.uint8), torch.empty(total, dtype=torch.uint8)
    a2a = lambda: dist.all_to_all_single(a2a_recv, a2a_send, sizes, [sizes[me]] * world, group=group)
    def with_copies():   # pack this rank's bytes, gather, copy every rank's bytes out (as the unpacking does)
        send[:sizes[me]].copy_(src); collective()
        for r in range(world): out[sum(sizes[:r]):sum(sizes[:r + 1])].copy_(recv[r * width:r * width + sizes[r]])
    # the bound: what one gather allocates before its collective and keeps through it. The send buffer (padded to the
    # largest rank's for the all-gather; this rank's pieces once per rank for the exact all-to-all the kit uses when
    # the pieces are uneven, `packing.evenly`), the receive buffer, and the output the tensors are views of
    even = world * width <= 1.05 * total
    # ... and the failure check's one small tensor (`votes.CHECK_BYTES`), which the meter counts too
    from lora_fsdp_kit.votes import CHECK_BYTES
    bound = (world * width + width if even else world * sizes[me] + total) + total + CHECK_BYTES
    size = dict(shard_world=world, sizes=sizes, width=width, lora_bytes=total, n=len(names), bound=bound)
    return collective, with_copies, a2a, size

def _shared_dir()->str:
    box = [tempfile.mkdtemp(prefix="bench-gather-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)
    return box[0]

def _profile(fn, top:int=14)->str:
    "cProfile's top functions (cumulative) of one call of `fn` on this rank."
    pr = cProfile.Profile(); pr.enable(); fn(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(top)
    return s.getvalue()

def run_setting(model:str, setting:str, runs:int, profile:bool)->dict:
    "One model under one sharding on this rank: times, limits, bytes, peak."
    from safetensors.torch import save_file
    from lora_fsdp_kit.export import save_lora
    from lora_fsdp_kit.gather import gather_engine, gather_lora
    from lora_fsdp_kit.testing import case_wrap
    policy, kind, sharding, _ = SETTINGS[setting]
    fm = case_wrap(bench_model(model), policy, kind, sharding)
    collective, with_copies, a2a, size = raw_limit(fm)
    measure_gather, AllGatherCounter = _meter()
    res = dict(model=model, setting=setting, world=dist.get_world_size(), **size)
    with AllGatherCounter() as c: got = gather_lora(fm, progress=False)
    res.update(collectives=c.calls, bytes=c.bytes)
    eng = gather_engine(fm)
    def vote_rounds():   # the failure check of one gather_lora alone: one 72-byte all-reduce before its collective
        with eng.vote("bench") as v: v.check("collective 0")
    res.update(timed(dict(gather=lambda: gather_lora(fm, progress=False), raw=collective, raw_copies=with_copies,
                          a2a=a2a, vote=vote_rounds), runs))
    folder = _shared_dir()
    target, plain = os.path.join(folder, "adapter"), os.path.join(folder, "plain.safetensors")
    def save_limit():
        with_copies()
        if dist.get_rank() == 0: save_file(got, plain, metadata={"format": "pt"})
    res.update(timed(dict(save=lambda: save_lora(fm, target), save_limit=save_limit), runs))
    p = measure_gather(fm, "packed")
    res.update(peak=p.peak_extra, bound=size["bound"])
    if profile and dist.get_rank() == 0: res["profile"] = _profile(lambda: gather_lora(fm, progress=False))
    elif profile: gather_lora(fm, progress=False)
    dist.barrier()
    if dist.get_rank() == 0: shutil.rmtree(folder, ignore_errors=True)
    return res

def run_rank(models:list[str], runs:int, profile:bool)->list[dict]:
    w = dist.get_world_size()
    return [run_setting(m, s, runs, profile) for m in models for s, v in SETTINGS.items() if w in v[3]]

def report(rows:list[dict], runs:int)->bool:
    med = lambda xs: statistics.median(xs) * 1e3
    print(f"\nmedians of {runs} runs (ms, the slowest rank's); limit = one raw all_gather_into_tensor of the same "
          f"bytes + the copies; save limit = that + rank 0 writing the same tensors (safetensors)")
    head = (f"{'model':<8}{'ranks':>6} {'setting':<14}{'tensors':>8}{'LoRA':>11}{'coll.':>6}{'bytes/LoRA':>11}"
            f"{'gather':>8}{'raw':>7}{'limit':>7}{'ratio':>7}{'a2a':>7}{'save':>8}{'limit':>7}{'ratio':>7}"
            f"{'vote':>6}{'-vote':>7}{'peak':>11}{'bound':>11}")
    print(head)
    ok = True
    for r in rows:
        g, lim, s, sl = med(r["gather"]), med(r["raw_copies"]), med(r["save"]), med(r["save_limit"])
        ok &= g / lim <= 3 and r["peak"] <= r["bound"]
        print(f"{r['model']:<8}{r['world']:>6} {r['setting']:<14}{r['n']:>8}{fmt_bytes(r['lora_bytes']):>11}"
              f"{r['collectives']:>6}{r['bytes'] / r['lora_bytes']:>11.3f}{g:>8.2f}{med(r['raw']):>7.2f}{lim:>7.2f}"
              f"{g / lim:>7.2f}{med(r['a2a']):>7.2f}{s:>8.1f}{sl:>7.1f}{s / sl:>7.2f}{med(r['vote']):>6.2f}"
              f"{(g - med(r['vote'])) / lim:>7.2f}{fmt_bytes(r['peak']):>11}"
              f"{fmt_bytes(r['bound']):>11}")
    return ok

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--models", nargs="+", default=["llama", "thinker"], choices=["llama", "thinker"])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of one gather (rank 0)")
    ap.add_argument("--strategies", action="store_true", help="run the comparison of gather strategies instead")
    ap.add_argument("--out", default=OUT)
    a, rest = ap.parse_known_args(argv)
    if a.strategies:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gather_strategies
        return gather_strategies.main(rest)
    os.makedirs(a.out, exist_ok=True)
    rows = []
    for world in a.ranks:
        t0 = time.perf_counter()
        rows += launch(run_rank, a.models, a.runs, a.profile, nprocs=world, quiet=True, timeout=3000)[0]
        print(f"# {world} gloo ranks, CPU: {time.perf_counter() - t0:.0f} s")
    for r in rows:
        if "profile" in r:
            print(f"\n## cProfile, one gather: {r['model']} {r['setting']} {r['world']} ranks\n{r['profile']}")
    ok = report(rows, a.runs)
    with open(os.path.join(a.out, "gather_limit.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k != "profile"} for r in rows], f, indent=1)
    print(f"\ngoal (every gather <= 3x its limit, peak <= bound): {'MET' if ok else 'MISSED'}")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())

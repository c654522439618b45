"""Bench: `gather_lora` and `save_lora` against their physical limit, measured side by side in one run on gloo ranks.

For each model (a 24-layer llama, hidden 256: 1.31 MiB of LoRA in 192 tensors; a 12-layer Qwen3-Omni thinker: 180 KiB
in 108; LoRA r=8 on q/k/v/o) and each sharding (FSDP1 with LoRA leaves as units, FSDP1 with decoder layers as units,
FSDP2, and at 4 ranks hybrid sharding 2 x 2 with FSDP1 and FSDP2): 16 cases. It times, as the median of `--runs` runs
after a warm-up (the slowest rank's time), every call interleaved with the others (run i of each, then run i + 1) so
that each ratio compares calls made under the same load:
- `kit`: `gather_lora(model)`;
- `pair`: what a checked gather cannot avoid, in raw torch.distributed calls of the same bytes: the failure check's
  72-byte all-reduce (`votes.CHECK_BYTES`, in the vote's group), then `one`;
- `one`: the data collective alone (the all-gather of blocks padded to the largest rank's; the exact all-to-all where
  pieces are uneven, `packing.evenly`), raw;
- `vote`: the kit's check alone (a `RankVote`'s first `check`: its arrival through the store, which carries every
  rank's failure flag and call tag, so no all-reduce follows unless the call is nested);
  `arr.`: that arrival, raw (each rank appends to one store key, then reads it until every rank is there: what makes a
  call made on some ranks only raise within `LFK_ARRIVAL_TIMEOUT` instead of hanging); `floor` = `arr.` + `pair`;
- `a2a`, `a-g`, `copies`: either kind of collective, and the all-gather with the packing and unpacking copies;
- `save_lora(model, dir)` against `copies` plus rank 0 writing the same tensors with safetensors (`--no-save`: not).
Goal per case (the verdict column): kit <= 1.5 x pair, and from 1 MiB of LoRA on also kit <= 3 x one; and the peak
extra memory of one gather (torch's MemTracker) <= send + receive buffers + the full LoRA tensors + the check's 72
bytes. The header prints the machine's load average (1 min) over each launch: on 2 shared cores the ratios move with
it. `--profile` prints cProfile's top functions of one (second) gather on rank 0; `--strategies` runs the older
comparison of gather strategies (per unit, per tensor, whole model).

Measured 2026-12-06 (2 cores shared with 3 other sessions; load average 7-12 throughout), `--runs 21 --no-save`, the
kit before and after this round alternated in one session: see the report of issue 48. Where the time goes, for
the thinker at 2 ranks (180 KiB): the check alone (`vote`) cost 1-4 ms against 0.3-0.5 ms for its raw all-reduce,
because the arrival before it was a store round of its own (`arr.`, 0.35 ms raw), not counted in `pair`; folded into
the arrival (the first check's flag and tags written with it) it costs 0.6-1.0 ms (about `arr.` + 0.25 ms); the gather's
own work is about 0.35 ms of CPU on an idle core (reading 108 pieces 20 us, packing 40 us, making 108 output views
110-190 us, the reorder 10 us, the engine's look-up 25 us), and on 2 cores at load 8-10 every such step and every
wake-up after a blocking call takes several times its idle time.
Measured 2026-12-07 (load 4-8 throughout, the kit before and after alternated): at 2 ranks the kit's main thread
spends about 1.1 ms of CPU per gather (thinker, FSDP1 leaves), 5-10 times what the same steps cost in a tight loop:
after each blocking call (barrier, store round, collective) the caches hold other processes' data, so every object a
gather touches (127 units' handles, 108 pieces, 108 views) is a cache miss. Since then a call's first check writes its
arrival, then packs, then reads the others' arrivals (`RankVote.arrive_async`); rank 0 deletes old arrival keys
once per block of calls (`votes.arrival_block`), while the data collective is in flight (`RankVote.tidy`), as the
output views are made; the view's check reads one attribute per FSDP1 unit (its handle) where it read two. The
check itself stays, before every data collective, on every rank.
Run: `python bench/gather.py [--ranks 2 4] [--models llama thinker] [--settings ...] [--runs 15] [--no-save]
[--profile]`.
"""
from __future__ import annotations

import argparse, contextlib, cProfile, io, json, os, pstats, shutil, statistics, sys, tempfile, time

import torch
import torch.distributed as dist

from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
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
    try: from lora_fsdp_kit.memory import measure as m; m.measure_gather
    except (ImportError, AttributeError): from lora_fsdp_kit.memory import core as m
    return m.measure_gather, m.AllGatherCounter

def raw_limit(fm)->tuple:
    """The raw references of one packed gather, raw torch.distributed calls of the same bytes: {name: fn} and sizes.
    `one`: the data collective the kit makes (an all-gather of blocks padded to the largest rank's; an exact all-to-all
    where pieces are uneven, `packing.evenly`); `pair`: the failure check's 72-byte all-reduce (in the vote's group),
    then `one` (what a checked gather cannot avoid); `allgather`, `a2a`: either kind of collective; `copies`: `one`
    plus packing this rank's bytes and copying every rank's out."""
    from lora_fsdp_kit.gather.core import gather_engine
    from lora_fsdp_kit.gather.packing import evenly
    from lora_fsdp_kit.gather.votes import CHECK_BYTES, _default_store
    eng = gather_engine(fm)
    names = list(dict.fromkeys(eng.primary(n) for n in eng.lora_names()))
    shards = [t for t in eng.shards(names) if t.group is not None]
    group = shards[0].group
    world, me = dist.get_world_size(group), dist.get_rank(group)
    sizes = [sum(t.piece_bytes(r) for t in shards) for r in range(world)]
    width, total, even = max(sizes), sum(sizes), evenly(sizes)
    src = torch.randint(0, 255, (sizes[me],), dtype=torch.uint8)
    send, recv = torch.empty(width, dtype=torch.uint8), torch.empty(world * width, dtype=torch.uint8)
    out = torch.empty(total, dtype=torch.uint8)
    allgather = lambda: dist.all_gather_into_tensor(recv, send, group=group)
    a2a_send, a2a_recv = torch.empty(world * sizes[me], dtype=torch.uint8), torch.empty(total, dtype=torch.uint8)
    a2a = lambda: dist.all_to_all_single(a2a_recv, a2a_send, sizes, [sizes[me]] * world, group=group)
    one = allgather if even else a2a
    flag = torch.zeros(CHECK_BYTES // 8, dtype=torch.int64)
    check = lambda: dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=eng.vote_group)
    def pair(): check(); one()
    vg = eng.vote_group   # the check's group: its ranks meet at the arrival too
    members, seat = (dist.get_process_group_ranks(vg), dist.get_rank(vg)) if vg else (range(dist.get_world_size()), me)
    store, calls, prefix = _default_store(), [0], f"bench/arrive/{min(members)}"
    try: from lora_fsdp_kit.gather.votes import arrival_block; block = arrival_block(len(members))
    except ImportError: block = 1   # the kit before blocks: one key per call
    def arrival():   # the kit's arrival, raw: every rank appends to its block's store key, then reads it until all of
        calls[0] += 1   # this call's entries are there; rank 0 deletes the last block's key once all are in this one
        c, nap = calls[0], 1e-4
        key, mine = f"{prefix}/b{c // block}", b",%d/" % c
        store.append(key, f"{c}/{seat},")
        while (b"," + store.get(key)).count(mine) < len(members): time.sleep(nap); nap = min(2 * nap, 0.02)
        if seat == 0 and c % block == 0: store.delete_key(f"{prefix}/b{c // block - 1}")
    def floor(): arrival(); check(); one()
    def copies():   # pack this rank's bytes, gather, copy every rank's bytes out (as the unpacking does)
        send[:sizes[me]].copy_(src); allgather()
        for r in range(world): out[sum(sizes[:r]):sum(sizes[:r + 1])].copy_(recv[r * width:r * width + sizes[r]])
    # the bound: what one gather allocates before its collective and keeps through it. The send buffer (padded to the
    # largest rank's for the all-gather; this rank's pieces once per rank for the exact all-to-all), the receive
    # buffer, the output the tensors are views of, and the failure check's one small tensor (`votes.CHECK_BYTES`)
    bound = (world * width + width if even else world * sizes[me] + total) + total + CHECK_BYTES
    size = dict(shard_world=world, sizes=sizes, width=width, lora_bytes=total, n=len(names), bound=bound, even=even)
    return dict(one=one, pair=pair, check=check, allgather=allgather, a2a=a2a, copies=copies, arrival=arrival,
                floor=floor), size

def _shared_dir()->str:
    box = [tempfile.mkdtemp(prefix="bench-gather-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)
    return box[0]

def _profile(fn, top:int=14)->str:
    "cProfile's top functions (cumulative) of one call of `fn` on this rank."
    pr = cProfile.Profile(); pr.enable(); fn(); pr.disable()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(top)
    return s.getvalue()

def run_setting(model:str, setting:str, runs:int, profile:bool, save:bool=True)->dict:
    "One model under one sharding on this rank: times, references, bytes, peak."
    from safetensors.torch import save_file
    from lora_fsdp_kit.export.core import save_lora
    from lora_fsdp_kit.gather.core import gather_engine, gather_lora
    from lora_fsdp_kit.testing.core import case_wrap
    policy, kind, sharding, _ = SETTINGS[setting]
    fm = case_wrap(bench_model(model), policy, kind, sharding)
    raw, size = raw_limit(fm)
    measure_gather, AllGatherCounter = _meter()
    res = dict(model=model, setting=setting, world=dist.get_world_size(), **size)
    with AllGatherCounter() as c: got = gather_lora(fm, progress=False)
    res.update(collectives=c.calls, bytes=c.bytes)
    eng = gather_engine(fm)
    def vote_rounds():   # the failure check of one gather_lora alone: its arrival round, which carries the check
        with eng.vote("bench") as v: v.check("collective 0")
    # the kit's gather and its raw references, interleaved: each ratio compares calls made under the same load
    res.update(timed(dict(gather=lambda: gather_lora(fm, progress=False), pair=raw["pair"], one=raw["one"],
                          check=raw["check"], allgather=raw["allgather"], a2a=raw["a2a"], copies=raw["copies"],
                          vote=vote_rounds, arrival=raw["arrival"], floor=raw["floor"]), runs))
    if save:
        folder = _shared_dir()
        target, plain = os.path.join(folder, "adapter"), os.path.join(folder, "plain.safetensors")
        def save_limit():
            raw["copies"]()
            if dist.get_rank() == 0: save_file(got, plain, metadata={"format": "pt"})
        res.update(timed(dict(save=lambda: save_lora(fm, target), save_limit=save_limit), runs))
    p = measure_gather(fm, "packed")
    res.update(peak=p.peak_extra, bound=size["bound"])
    if profile and dist.get_rank() == 0: res["profile"] = _profile(lambda: gather_lora(fm, progress=False))
    elif profile: gather_lora(fm, progress=False)
    dist.barrier()
    if save and dist.get_rank() == 0: shutil.rmtree(folder, ignore_errors=True)
    return res

def run_rank(models:list[str], runs:int, profile:bool, settings:list[str], save:bool)->list[dict]:
    w = dist.get_world_size()
    return [run_setting(m, s, runs, profile, save) for m in models for s, v in SETTINGS.items()
            if w in v[3] and s in settings]

MIB = 1 << 20   # from this adapter size on, the kit's gather is held to 3x one raw collective as well

def verdict(r:dict)->tuple[float, float, bool]:
    "(kit / raw pair, kit / raw one, met): within 1.5x of the pair, and within 3x of one from 1 MiB of LoRA on."
    g, pair, one = (statistics.median(r[k]) for k in ("gather", "pair", "one"))
    met = g / pair <= 1.5 and (r["lora_bytes"] < MIB or g / one <= 3) and r["peak"] <= r["bound"]
    return g / pair, g / one, met

def report(rows:list[dict], runs:int, loads:list)->bool:
    med = lambda xs: statistics.median(xs) * 1e3
    print(f"\nmedians of {runs} runs (ms, the slowest rank's), interleaved; pair = the check's raw 72-byte "
          f"all-reduce + the raw data collective (`one`: the all-gather, or the all-to-all where pieces are uneven), "
          f"same bytes; goal: kit <= 1.5 x pair, and <= 3 x one from 1 MiB of LoRA; vote = the kit's check alone "
          f"(its arrival round, carrying the flags and call tags); arr. = that arrival, raw (each rank appends to one store key and "
          f"reads it until every rank is there, so that a call made on some ranks only raises instead of hanging); "
          f"floor = arr. + pair; load average (1 min) " + ", ".join(f"{w} ranks {a:.1f}-{b:.1f}" for w, a, b in loads))
    head = (f"{'model':<8}{'ranks':>6} {'setting':<14}{'tensors':>8}{'LoRA':>11}{'coll.':>6}{'kit':>7}{'pair':>7}"
            f"{'one':>7}{'/pair':>7}{'/one':>7}{'':>7}{'check':>7}{'vote':>7}{'arr.':>7}{'floor':>7}{'/floor':>7}"
            f"{'a2a':>7}{'a-g':>7}{'copies':>7}"
            f"{'save':>8}{'limit':>7}{'ratio':>7}{'peak':>11}{'bound':>11}")
    print(head)
    ok = True
    for r in rows:
        rp, ro, met = verdict(r); ok &= met
        save = (f"{med(r['save']):>8.1f}{med(r['save_limit']):>7.1f}{med(r['save']) / med(r['save_limit']):>7.2f}"
                if "save" in r else f"{'-':>8}{'-':>7}{'-':>7}")
        print(f"{r['model']:<8}{r['world']:>6} {r['setting']:<14}{r['n']:>8}{fmt_bytes(r['lora_bytes']):>11}"
              f"{r['collectives']:>6}{med(r['gather']):>7.2f}{med(r['pair']):>7.2f}{med(r['one']):>7.2f}{rp:>7.2f}"
              f"{ro:>7.2f}{'met' if met else 'MISS':>7}{med(r['check']):>7.2f}{med(r['vote']):>7.2f}"
              f"{med(r['arrival']):>7.2f}{med(r['floor']):>7.2f}{med(r['gather']) / med(r['floor']):>7.2f}"
              f"{med(r['a2a']):>7.2f}{med(r['allgather']):>7.2f}{med(r['copies']):>7.2f}{save}"
              f"{fmt_bytes(r['peak']):>11}{fmt_bytes(r['bound']):>11}")
    return ok

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--models", nargs="+", default=["llama", "thinker"], choices=["llama", "thinker"])
    ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--no-save", dest="save", action="store_false", help="time the gathers only, not save_lora")
    ap.add_argument("--profile", action="store_true", help="print cProfile's top functions of one gather (rank 0)")
    ap.add_argument("--strategies", action="store_true", help="run the comparison of gather strategies instead")
    ap.add_argument("--out", default=OUT)
    a, rest = ap.parse_known_args(argv)
    if a.strategies:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import gather_strategies
        return gather_strategies.main(rest)
    os.makedirs(a.out, exist_ok=True)
    rows, loads = [], []
    for world in a.ranks:
        t0, l0 = time.perf_counter(), os.getloadavg()[0]
        rows += launch(run_rank, a.models, a.runs, a.profile, a.settings, a.save, nprocs=world, quiet=True,
                       timeout=3000)[0]
        loads.append((world, min(l0, os.getloadavg()[0]), max(l0, os.getloadavg()[0])))
        print(f"# {world} gloo ranks, CPU ({os.cpu_count()} cores): {time.perf_counter() - t0:.0f} s")
    for r in rows:
        if "profile" in r:
            print(f"\n## cProfile, one gather: {r['model']} {r['setting']} {r['world']} ranks\n{r['profile']}")
    ok = report(rows, a.runs, loads)
    with open(os.path.join(a.out, "gather_limit.json"), "w") as f:
        json.dump([{k: v for k, v in r.items() if k != "profile"} | dict(zip(("vs_pair", "vs_one", "met"), verdict(r)))
                   for r in rows], f, indent=1)
    n = sum(verdict(r)[2] for r in rows)
    print(f"\ngoal (kit <= 1.5 x pair everywhere, <= 3 x one from 1 MiB, peak <= bound): {n} of {len(rows)} met: "
          f"{'MET' if ok else 'MISSED'}")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())

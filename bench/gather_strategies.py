"""Bench (`python bench/gather.py --strategies`): gathering LoRA from FSDP shards — the packed one-collective gather (what `gather_lora` does) against the
per-unit and per-tensor paths and the whole-model baseline, on FSDP1 and FSDP2, at 2 and 4 gloo ranks on the CPU.

Models: a narrow llama of 24 decoder layers (hidden 256) and a wide one whose decoder layers hold >= 30 MB each; LoRA
r=8 on q/k/v/o. For every strategy it prints the collectives per gather and the bytes they move (counted at the
collectives), bytes / LoRA bytes, the peak extra memory (torch's MemTracker) beside the plan's predictions, and the
time per gather: the median of 7 runs after a warm-up, each timed inside the ranks (the slowest rank counts).
Targets: FSDP1 with decoder-layer units moves <= 1.05 x the LoRA bytes; one collective per gather; time <= 0.3 x the
per-tensor/per-unit path of the same run. Saves one PNG per setting to bench/out/ and the figures to gather.json.
Run: `python bench/gather.py [--ranks 2 4] [--models narrow wide] [--runs 7]`.
"""
from __future__ import annotations

import argparse, contextlib, json, os, statistics, sys, time

import torch
import torch.distributed as dist

from lora_fsdp_kit.gather.core import gather_engine
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.memory.measure import GATHER_STRATEGIES, measure_gather, plot_gather
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.units import fmt_bytes
from lora_fsdp_kit.plan.core import plan_fsdp1, plan_fsdp2
from lora_fsdp_kit.plan.policies import layer_wrap_policy, peft_wrap_policy, resolve_layer_classes
from lora_fsdp_kit.plan.wrap import wrap_fsdp1, wrap_fsdp2

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
MODELS = {  # name: (layers, hidden, intermediate)
    "narrow": (24, 256, 512),     # the 24-layer llama, hidden 256
    "wide": (4, 768, 3072),       # decoder layers of ~37 MB (fp32)
}
SETTINGS = {  # name: (flavour, strategies, the per-tensor/per-unit path packed replaces, description)
    "fsdp1_layer": ("fsdp1", ("whole", "per_unit", "packed"), "per_unit",
                    "FSDP1, decoder layers as units (layer_wrap_policy), use_orig_params=True"),
    "fsdp1_peft": ("fsdp1", ("whole", "per_unit", "packed"), "per_unit",
                   "FSDP1, peft's policy (every lora_A/lora_B its own unit), use_orig_params=False"),
    "fsdp2": ("fsdp2", ("whole", "per_unit", "lora_only", "packed"), "lora_only",
              "FSDP2, fully_shard on decoder layers, then the root"),
}

def bench_model(name:str):
    layers, hidden, inter = MODELS[name]
    cfg = dict(shipped_config("llama"), num_hidden_layers=layers, hidden_size=hidden, intermediate_size=inter,
               head_dim=hidden // 4, num_attention_heads=4, num_key_value_heads=2)
    return add_lora(model_from_config(cfg, device="cpu"), r=8)

def wrap(setting:str, pm):
    if setting == "fsdp1_layer":
        pol = layer_wrap_policy(pm)
        return plan_fsdp1(pm, pol, use_orig_params=True), wrap_fsdp1(pm, pol, use_orig_params=True)
    if setting == "fsdp1_peft":
        pol = peft_wrap_policy(pm)
        return plan_fsdp1(pm, pol), wrap_fsdp1(pm, pol)
    cls = list(resolve_layer_classes(pm, "auto"))
    return plan_fsdp2(pm, cls), wrap_fsdp2(pm, cls)

def timed(fm, strategy:str, runs:int)->list[float]:
    "Seconds per gather with `strategy`, each the slowest rank's, after one warm-up run (no meters attached)."
    engine = gather_engine(fm)
    names = list(engine.lora_names())
    fn, none = GATHER_STRATEGIES[strategy], lambda u: contextlib.nullcontext()
    out = []
    for i in range(runs + 1):
        dist.barrier()
        t0 = time.perf_counter()
        fn(engine, names, none)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i: out.append(dt.item())
    return out

def run_rank(model:str, runs:int)->dict:
    "Every strategy of every setting on this rank: a measured profile and the timed runs."
    out = {}
    for setting, (fl, strategies, _, _) in SETTINGS.items():
        plan, fm = wrap(setting, bench_model(model))
        for s in strategies:
            out[(setting, s)] = dict(profile=measure_gather(fm, s, plan=plan), times=timed(fm, s, runs))
        del fm
    return out

def report(model:str, world:int, res:dict)->tuple[list[dict], bool]:
    rows, ok = [], True
    for setting, (fl, strategies, slow, desc) in SETTINGS.items():
        p0 = res[(setting, "packed")]["profile"]
        print(f"\n== {model} model, {world} ranks, {setting}: {desc}\n   model {fmt_bytes(p0.model_bytes)}, largest "
              f"LoRA unit {fmt_bytes(p0.largest_lora_unit)}, LoRA {fmt_bytes(p0.lora_bytes)}")
        print(f"{'strategy':<11}{'coll.':>6}{'bytes':>12}{'/LoRA':>8}{'pred.':>8}{'peak':>12}{'pred.':>8}"
              f"{'median ms':>11}{'min ms':>9}{'/ ' + slow:>14}")
        med = {s: statistics.median(res[(setting, s)]["times"]) for s in strategies}
        for s in strategies:
            p, t = res[(setting, s)]["profile"], res[(setting, s)]["times"]
            dev = lambda pr, m: f"{m / pr - 1:+.1%}" if pr else "-"
            coll = sum(u.collectives for u in p.units)
            print(f"{s:<11}{coll:>6}{fmt_bytes(p.bytes_gathered):>12}{p.bytes_gathered / p.lora_bytes:>8.2f}"
                  f"{dev(p.predicted_bytes, p.bytes_gathered):>8}{fmt_bytes(p.peak_extra):>12}"
                  f"{dev(p.predicted_peak, p.peak_extra):>8}{med[s] * 1e3:>11.1f}{min(t) * 1e3:>9.1f}"
                  f"{med[s] / med[slow]:>14.2f}")
            rows.append(dict(model=model, world=world, setting=setting, strategy=s, collectives=coll,
                             bytes=p.bytes_gathered, lora_bytes=p.lora_bytes, predicted_bytes=p.predicted_bytes,
                             peak=p.peak_extra, predicted_peak=p.predicted_peak, median_s=med[s], times=t))
        coll = sum(u.collectives for u in p0.units)
        ratio, tr = p0.bytes_gathered / p0.lora_bytes, med["packed"] / med[slow]
        met = coll == 1 and ratio <= 1.05 and tr <= 0.3
        print(f"targets (packed): 1 collective [{coll}], bytes/LoRA <= 1.05 [{ratio:.3f}], time <= 0.3 x {slow} "
              f"[{tr:.2f}]: {'MET' if met else 'MISSED'}")
        ok &= met
    return rows, ok

def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if a.runs < 7: print(f"note: {a.runs} timed runs (the target figures are quoted for >= 7)")
    import matplotlib; matplotlib.use("Agg")
    os.makedirs(a.out, exist_ok=True)
    rows, ok = [], True
    for world in a.ranks:
        for model in a.models:
            t0 = time.perf_counter()
            res = launch(run_rank, model, a.runs, nprocs=world, quiet=True, timeout=1800)[0]
            print(f"\n# {model}: {MODELS[model]} (layers, hidden, intermediate), {world} gloo ranks, CPU; figures from "
                  f"rank 0, times the slowest rank's; {time.perf_counter() - t0:.0f} s")
            r, met = report(model, world, res); rows += r; ok &= met
            for setting, (_, strategies, _, desc) in SETTINGS.items():
                fig = plot_gather({s: res[(setting, s)]["profile"] for s in strategies},
                                  title=f"{desc} — {model} llama, {world} ranks")
                fig.savefig(os.path.join(a.out, f"gather_{model}_{world}r_{setting}.png"), dpi=100)
    with open(os.path.join(a.out, "gather.json"), "w") as f: json.dump(rows, f, indent=1)
    print(f"\nall targets: {'MET' if ok else 'MISSED'}")
    return 0 if ok else 1

if __name__ == "__main__":
    sys.exit(main())

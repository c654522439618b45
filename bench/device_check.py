"""Accelerator check: the kit's gather strategies on the devices this machine has, measured beside the plan.

Ready for the day a GPU or NPU machine is lent, and run on the CPU in CI (tests/test_device_check.py) so it is
known to work before then. It detects the platform (`lora_fsdp_kit.platform.detect_platform`), then, for each
world size -- every visible device, and one device on its own -- launches that many ranks with the kit's launcher
(NCCL on NVIDIA, HCCL on Ascend; on the CPU 2 gloo ranks, and `--worlds 2,1` adds a single rank). Each rank builds a
narrow llama with LoRA on its device, wraps it with FSDP1 (LoRA leaves + decoder layers) and with FSDP2 (decoder
layers), and gathers the LoRA weights with every strategy of `lora_fsdp_kit.memory.measure.GATHER_STRATEGIES` through
`measure_gather`. Per unit it records the peak extra memory (the device allocator's `max_memory_allocated` on an
accelerator; torch's MemTracker of tensor storages on the CPU), the bytes all-gathered and the time, beside what
the plan predicted; per strategy also the allocator's reserved peak where the device reports one.

Output (`--out`, default bench/out/device_check/): `device_check.json` (platform, versions, every run) and
`device_check.png` (per-unit peak memory and bytes, measured vs predicted, one row per world size and flavour).
Exit status 1 if a run failed or a measured byte count strays more than 5 % from the plan's prediction.

Memory of a training step (issues 17 and 31), on a GPU or NPU only: for 8 configurations (Llama FSDP2 fp32 and bf16
with activation checkpointing, FSDP1 with LoRA-leaf units and with decoder-layer units in bf16, a Qwen3 MoE and the
Qwen3-Omni thinker in bf16, and fp32 master weights with bf16 compute on a bf16 config under FSDP2 and FSDP1), each
rank trains a tiny LoRA model 2 steps on its device and reads the allocator's `max_memory_allocated` over the second
(less what the device held before the case), and beside it `max_memory_reserved` (what the allocator took from the
device: cached blocks and fragmentation, which the prediction does not count); `lora_fsdp_kit.fits.core` predicts the
same step on one CPU, with the attention kernel the device runs (`fits_trace.attention_kernel`: CUDA runs float32 with
grouped-query heads on the math kernel), recorded per row as `attention`. A prediction more than 5 % off is a problem
(exit 1). On the CPU this part says there is no device and is skipped (the CPU's proof is tests/test_fits.py, against
the CPU allocator's running total on real gloo ranks).
Run: `python bench/device_check.py [--layers 8 --hidden 1024] [--worlds 2,1] [--no-memory]` (minutes on a GPU).
"""
from __future__ import annotations

import argparse, json, os, sys, time

import torch

from lora_fsdp_kit.fits.step import train_kwargs   # the step fits predicts: no KV cache
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.memory.measure import GATHER_STRATEGIES, measure_gather
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.units import fmt_bytes
from lora_fsdp_kit.platform import detect_platform, get_platform
from lora_fsdp_kit.plan.core import plan_fsdp1, plan_fsdp2
from lora_fsdp_kit.plan.policies import lora_wrap_policy, resolve_layer_classes
from lora_fsdp_kit.plan.wrap import wrap_fsdp1, wrap_fsdp2

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "device_check")
TOLERANCE = 0.05   # measured bytes may differ from the plan's prediction by this fraction

SETTINGS = {  # name: (flavour, what is wrapped)
    "fsdp1": ("fsdp1", "FSDP1: LoRA leaves + decoder layers (lora_wrap_policy)"),
    "fsdp2": ("fsdp2", "FSDP2: fully_shard on decoder layers, then the root"),
}
STRATEGIES = {"fsdp1": ("whole", "per_unit"), "fsdp2": ("whole", "per_unit", "lora_only")}

def build_model(layers:int, hidden:int, device:torch.device):
    "A narrow llama with `layers` decoder layers, LoRA on q/k/v/o, on `device`."
    cfg = dict(shipped_config("llama"), num_hidden_layers=layers, hidden_size=hidden, intermediate_size=2 * hidden,
               head_dim=hidden // 4, num_attention_heads=4, num_key_value_heads=2)
    return add_lora(model_from_config(cfg, device=device), r=8)

def _allocator(plat)->dict:
    "The device allocator's own counters (those this device module has)."
    mod, out = plat.device_module, {}
    for k in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        f = getattr(mod, k, None)
        if callable(f):
            try: out[k] = int(f())
            except Exception: pass   # torch.cpu has none of these
    return out

def _profile_row(p, allocator:dict)->dict:
    units = [dict(name=u.name or "<root>", bytes_gathered=u.bytes_gathered, predicted_bytes=u.predicted_bytes,
                  peak_extra=u.peak_extra, unit_bytes=u.unit_bytes, collectives=u.collectives, seconds=u.seconds)
             for u in p.units]
    return dict(strategy=p.strategy, flavour=p.flavour, world_size=p.world_size, bytes_gathered=p.bytes_gathered,
                predicted_bytes=p.predicted_bytes, min_bytes=p.min_bytes, peak_extra=p.peak_extra,
                predicted_peak=p.predicted_peak, seconds=p.seconds, lora_bytes=p.lora_bytes,
                largest_lora_unit=p.largest_lora_unit, model_bytes=p.model_bytes, memory_source=p.memory_source,
                unit_deviation=p.unit_deviation, allocator=allocator, units=units)

def run_rank(layers:int, hidden:int)->dict:
    "On one rank: every strategy on FSDP1 and FSDP2, measured; rows ready for JSON."
    import torch.distributed as dist
    plat = get_platform()
    dev = plat.torch_device()
    rows, errors, t0 = [], [], time.perf_counter()
    for setting, (flavour, _) in SETTINGS.items():
        try:
            pm = build_model(layers, hidden, dev)
            if flavour == "fsdp1":
                pol = lora_wrap_policy(pm); plan = plan_fsdp1(pm, pol); fm = wrap_fsdp1(pm, pol)
            else:
                cls = list(resolve_layer_classes(pm, "auto"))
                plan = plan_fsdp2(pm, cls); fm = wrap_fsdp2(pm, cls)
            for s in STRATEGIES[setting]:
                if s not in GATHER_STRATEGIES: raise KeyError(f"strategy {s!r} is not in GATHER_STRATEGIES")
                if plat.device_name != "cpu": plat.synchronize(); plat.reset_peak_memory_stats()
                before = _allocator(plat)
                p = measure_gather(fm, s, plan=plan)
                after = _allocator(plat)
                alloc = {f"{k}_before": v for k, v in before.items()} | after
                rows.append(dict(setting=setting, rank=dist.get_rank(), **_profile_row(p, alloc)))
            del fm, pm
        except Exception as e:   # one setting failing must not hide what the others measure
            import traceback
            where = traceback.extract_tb(e.__traceback__)[-1]
            errors.append(dict(setting=setting, rank=dist.get_rank(), world_size=dist.get_world_size(),
                               error=f"{type(e).__name__}: {e} (at {os.path.basename(where.filename)}:{where.lineno})"))
        if plat.device_name != "cpu": plat.empty_cache()
    return dict(rank=dist.get_rank(), device=str(dev), backend=dist.get_backend(), seconds=time.perf_counter() - t0,
                rows=rows, errors=errors)

MEMORY_TOLERANCE = 0.05   # predicted step peak vs max_memory_allocated
MOE_BF16 = dict(experts_implementation="grouped_mm")
BF16_CONFIG = dict(dtype="bfloat16")   # a config.json whose torch_dtype is bfloat16
STORAGE = {"config": None, "fp32": torch.float32, "bf16": torch.bfloat16}
MEMORY_CASES = [   # (name, tiny model, config overrides, WrapConfig fields, param_dtype: the storage `fits` is told)
    ("llama fsdp2 fp32", "llama", {}, dict(flavour="fsdp2"), "config"),
    ("llama fsdp2 bf16 ac", "llama", {}, dict(flavour="fsdp2", mixed_precision="bf16", activation_checkpointing=True),
     "config"),
    ("llama fsdp1 lora fp32", "llama", {}, dict(flavour="fsdp1", policy="lora"), "config"),
    ("qwen2 fsdp1 layer orig bf16", "qwen2", {}, dict(flavour="fsdp1", policy="layer", use_orig_params=True,
                                                      mixed_precision="bf16"), "config"),
    ("qwen3_moe fsdp2 bf16", "qwen3_moe", MOE_BF16, dict(flavour="fsdp2", mixed_precision="bf16"), "config"),
    ("qwen3_omni_thinker fsdp2 bf16 ac", "qwen3_omni_thinker", MOE_BF16,
     dict(flavour="fsdp2", mixed_precision="bf16", activation_checkpointing=True), "config"),
    # fp32 master weights with bf16 compute on a config that says bf16 (the usual FSDP setup, an RL actor's default):
    # the ranks build the model in fp32 whatever the config says, and `fits` is told param_dtype="fp32"
    ("llama fsdp2 fp32 master bf16", "llama", BF16_CONFIG, dict(flavour="fsdp2", mixed_precision="bf16"), "fp32"),
    ("qwen2 fsdp1 layer orig fp32 master bf16", "qwen2", BF16_CONFIG, dict(flavour="fsdp1", policy="layer",
                                                    use_orig_params=True, mixed_precision="bf16"), "fp32"),
]

def memory_rank(batch:int, seq:int)->list[dict]:
    "On one rank: each memory case trained 2 steps on the device; the allocator's peak over the second, per case."
    import gc, torch.distributed as dist
    from lora_fsdp_kit.plan.wrap import WrapConfig
    plat, rows = get_platform(), []
    dev = plat.torch_device()
    # cuBLAS keeps a workspace per thread that runs matrix products (ours and autograd's), allocated on first use
    # and kept: made here, before the first case, they are part of what every case finds held, not of its step
    for dt in (torch.float32, torch.bfloat16):
        a = torch.ones(64, 64, device=dev, dtype=dt, requires_grad=True); (a @ a).sum().backward()
    del a; plat.synchronize()
    reserved = lambda: int(getattr(plat.device_module, "memory_reserved", lambda: 0)())
    for name, model, over, wrap, param_dtype in MEMORY_CASES:
        row = dict(case=name, rank=dist.get_rank())
        try:
            gc.collect(); plat.empty_cache(); plat.synchronize()
            held, held_reserved = plat.memory_allocated(), reserved()   # what earlier cases left behind
            pm = add_lora(model_from_config(dict(shipped_config(model), **over), device=dev,
                                            dtype=STORAGE[param_dtype]), r=8)
            fm = WrapConfig(**wrap).wrap(pm)
            opt = torch.optim.AdamW([p for p in fm.parameters() if p.requires_grad], lr=1e-4)
            vocab = pm.get_input_embeddings().num_embeddings
            for i in range(2):
                if i == 1: plat.synchronize(); plat.reset_peak_memory_stats()
                ids = torch.randint(0, vocab, (batch, seq), device=dev)
                fm(input_ids=ids, labels=ids, **train_kwargs(pm)).loss.backward()
                opt.step(); opt.zero_grad(set_to_none=True)
            plat.synchronize()
            # the allocator's reserved peak beside it: what the device really gave (blocks cached, fragmentation)
            max_reserved = int(getattr(plat.device_module, "max_memory_reserved", lambda: 0)())
            row.update(peak=plat.max_memory_allocated() - held, held=held, reserved=max_reserved - held_reserved,
                       held_reserved=held_reserved)
            del fm, pm, opt
        except Exception as e: row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
        rows.append(row)
    return rows

def predict_memory(world:int, batch:int, seq:int)->tuple[dict, dict]:
    "Per memory case at `world` (traced on one CPU): the prediction or the line why not; and the attention kernel."
    from lora_fsdp_kit.fits.core import FitsError, predict_step_memory
    from lora_fsdp_kit.fits.step import attention_kernel
    from lora_fsdp_kit.plan.wrap import WrapConfig
    out, kernels, backend = {}, {}, get_platform().dist_backend
    for name, model, over, wrap, param_dtype in MEMORY_CASES:
        pm = add_lora(model_from_config(dict(shipped_config(model), **over), device="meta"), r=8)
        # the kernel the prediction traced (what `attention="auto"` picks): "math" where CUDA has no fused kernel
        kernels[name] = attention_kernel(pm, WrapConfig(**wrap), backend)
        try:
            pred = predict_step_memory(pm, world=world, wrap=WrapConfig(**wrap), batch=batch, seq=seq,
                                       backend=backend, attention=kernels[name], param_dtype=param_dtype)
            out[name] = pred.peak_bytes; print(f"predicted {name}: {pred.label}, {kernels[name]} attention")
        except FitsError as e: out[name] = str(e)
    return out, kernels

def memory_problems(rows:list[dict], predicted:dict)->list[str]:
    "One line per memory case that failed on a rank or whose prediction is more than MEMORY_TOLERANCE off."
    out = []
    for r in rows:
        where = f"memory {r['case']} rank {r['rank']}"
        p = predicted.get(r["case"])
        if "error" in r: out.append(f"{where} failed: {r['error']}")
        elif not isinstance(p, list): out.append(f"{where}: no prediction ({p})")
        elif abs(p[r["rank"]] / r["peak"] - 1) > MEMORY_TOLERANCE:
            out.append(f"{where}: max_memory_allocated {fmt_bytes(r['peak'])}, predicted {fmt_bytes(p[r['rank']])} "
                       f"({p[r['rank']] / r['peak'] - 1:+.1%})")
    return out

def memory_check(plat, worlds:list[int], batch:int, seq:int, timeout:float)->tuple[list, list]:
    "Rows and problems of the memory part; on the CPU, none (it says so)."
    if plat.device_name == "cpu":
        print("\nmemory check: no GPU or NPU here (platform cpu): skipped "
              "(tests/test_fits.py checks the CPU against the allocator's running total on real ranks)")
        return [], []
    rows, probs = [], []
    for w in worlds:
        try: res = launch(memory_rank, batch, seq, nprocs=w, quiet=True, timeout=timeout)
        except Exception as e: probs.append(f"memory world {w}: {type(e).__name__}: {str(e).strip().splitlines()[-1]}"); continue
        pred, kernels = predict_memory(w, batch, seq)
        got = [dict(r, world=w, predicted=pred.get(r["case"]), attention=kernels.get(r["case"]))
               for rank in res for r in rank]
        rows += got; probs += memory_problems(got, pred)
        print(f"\n== memory, world size {w} (batch {batch} x seq {seq})")
        for r in got:
            p = r["predicted"]; p = p[r["rank"]] if isinstance(p, list) else None
            print(f"{r['case']:<40} rank {r['rank']}  max_memory_allocated {fmt_bytes(r.get('peak')):>12}  "
                  f"max_memory_reserved {fmt_bytes(r.get('reserved')):>12}  "
                  f"predicted {fmt_bytes(p):>12} ({r['attention']} attention)  "
                  + (f"{p / r['peak'] - 1:+.2%}" if p and r.get("peak") else r.get("error", "")))
    return rows, probs

def _versions()->dict:
    import importlib.metadata as md
    out = {"python": sys.version.split()[0]}
    for d in ("torch", "transformers", "peft", "torch_npu", "lora_fsdp_kit"):
        try: out[d] = md.version(d)
        except md.PackageNotFoundError: pass
    out["cuda"] = torch.version.cuda
    return out

def world_sizes(device_name:str, count:int)->list[int]:
    "Every visible device, then one device on its own; on the CPU 2 gloo ranks (`--worlds 2,1` adds one)."
    if device_name == "cpu": return [2]
    if count < 1: raise RuntimeError(f"platform {device_name} reports {count} devices: nothing to run on")
    return [count, 1] if count > 1 else [1]

def problems(runs:list[dict])->list[str]:
    "One line per failed setting, and per measured byte count that strays from the plan by more than TOLERANCE."
    out = [f"world {e['world_size']} {e['setting']} rank {e['rank']} failed: {e['error']}"
           for r in runs for e in r["errors"]]
    for r in runs:
        for row in r["rows"]:
            pred, got = row["predicted_bytes"], row["bytes_gathered"]
            where = f"world {row['world_size']} {row['setting']}/{row['strategy']} rank {row['rank']}"
            if row["world_size"] == 1:   # one rank holds every unit whole: nothing may move
                if got or pred: out.append(f"{where}: gathered {fmt_bytes(got)}, plan said {fmt_bytes(pred)} (one rank)")
                continue
            if not pred: out.append(f"{where}: the plan made no prediction"); continue
            if abs(got / pred - 1) > TOLERANCE:
                out.append(f"{where}: gathered {fmt_bytes(got)}, plan said {fmt_bytes(pred)} ({got / pred - 1:+.1%})")
    return out

def plot(result:dict):
    "Per world size and flavour: per-unit peak extra memory and bytes, measured vs predicted; totals per strategy."
    import matplotlib.pyplot as plt
    by = {(r["world_size"], r["setting"], r["strategy"]): r for run in result["runs"] for r in run["rows"]
          if r["rank"] == 0}
    panels = [(w, s) for w in result["world_sizes"] for s in SETTINGS if (w, s, "per_unit") in by]
    if not panels: raise ValueError("no setting produced measurements: nothing to plot")
    fig, axes = plt.subplots(len(panels), 2, figsize=(15, 3.6 * len(panels)), layout="constrained", squeeze=False,
                             gridspec_kw=dict(width_ratios=[2.2, 1]))
    kib = 2**10
    for (w, s), (ax_u, ax_t) in zip(panels, axes):
        strat = "per_unit"
        r = by[(w, s, strat)]
        units = [u for u in r["units"] if u["collectives"] or u["predicted_bytes"]]
        x = range(len(units)); bw = 0.27
        ax_u.bar([i - bw for i in x], [u["peak_extra"] / kib for u in units], bw, color="#1f77b4",
                 label=f"peak extra memory above the gather's start ({r['memory_source']})")
        ax_u.bar(list(x), [u["bytes_gathered"] / kib for u in units], bw, color="#ff7f0e", label="bytes all-gathered")
        ax_u.bar([i + bw for i in x], [(u["predicted_bytes"] or 0) / kib for u in units], bw, color="none",
                 edgecolor="k", hatch="//", label="plan's predicted bytes")
        short = lambda n: n.replace("base_model.model.", "").replace("model.", "").replace(".default", "")[-26:]
        ax_u.set_xticks(list(x), [short(u["name"]) for u in units], rotation=60, ha="right", fontsize=7)
        top = max([u["peak_extra"] for u in units] + [u["bytes_gathered"] for u in units]
                  + [u["predicted_bytes"] or 0 for u in units] + [1])
        ax_u.set_ylim(0, top / kib * 1.5)   # room for the legend above the bars
        ax_u.set_ylabel("KiB"); ax_u.legend(fontsize=8, loc="upper left")
        ax_u.set_title(f"world size {w}, {SETTINGS[s][1]}: strategy '{strat}', per unit (rank 0)", fontsize=10)
        names = STRATEGIES[s]
        rows = [by[(w, s, n)] for n in names]
        xt = range(len(names))
        ax_t.bar([i - bw / 2 for i in xt], [q["peak_extra"] / kib for q in rows], bw, color="#1f77b4",
                 label="peak extra")
        ax_t.bar([i + bw / 2 for i in xt], [(q["predicted_peak"] or 0) / kib for q in rows], bw, color="none",
                 edgecolor="#1f77b4", hatch="//", label="plan's predicted peak")
        for i, q in enumerate(rows):
            ax_t.text(i, max(q["peak_extra"], q["predicted_peak"] or 0) / kib,
                      f"{fmt_bytes(q['bytes_gathered'])}\n{q['seconds'] * 1e3:.0f} ms", ha="center", va="bottom",
                      fontsize=7)
        ax_t.set_xticks(list(xt), names); ax_t.set_ylabel("KiB"); ax_t.margins(y=0.3)
        ax_t.set_title("whole gather per strategy (labels: bytes, time)", fontsize=10); ax_t.legend(fontsize=8)
    plat = result["platform"]
    fig.suptitle(f"device check on {plat['name']} ({plat['device']}, {plat['backend']}): llama {result['layers']} "
                 f"layers, hidden {result['hidden']}; torch {result['versions'].get('torch')}"
                 + (f"\nnot shown (failed): {len(result['problems'])} problems, see device_check.json"
                    if any(r["errors"] for r in result["runs"]) else ""))
    return fig

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 8 on a device, 4 on the CPU)")
    ap.add_argument("--hidden", type=int, default=None, help="hidden size (default 1024 on a device, 64 on the CPU)")
    ap.add_argument("--worlds", default=None, help="comma-separated world sizes (default: all devices, then 1)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds each launch may take")
    ap.add_argument("--out", default=OUT)
    ap.add_argument("--no-memory", action="store_true", help="skip the training-step memory part")
    ap.add_argument("--batch", type=int, default=4, help="memory part: sequences per rank")
    ap.add_argument("--seq", type=int, default=512, help="memory part: tokens per sequence")
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    det = detect_platform(smi_timeout=10)
    plat = get_platform()
    on_cpu = plat.device_name == "cpu"
    layers = a.layers or (4 if on_cpu else 8)
    hidden = a.hidden or (64 if on_cpu else 1024)
    count = plat.device_count()
    worlds = [int(w) for w in a.worlds.split(",")] if a.worlds else world_sizes(plat.device_name, count)
    if not on_cpu and max(worlds) > count:
        raise SystemExit(f"error: world size {max(worlds)} > {count} visible {plat.device_name} devices")
    print(det)
    print(f"device check: {plat.name} ({plat.device_name}, {count} visible, backend {plat.dist_backend}); "
          f"world sizes {worlds}; llama {layers} layers, hidden {hidden}")
    runs, failed = [], []
    for w in worlds:
        t = time.perf_counter()
        try: res = launch(run_rank, layers, hidden, nprocs=w, quiet=True, timeout=a.timeout)
        except Exception as e:
            failed.append(f"world {w}: {type(e).__name__}: {' | '.join(str(e).strip().splitlines()[-2:])}")
            print("FAILED", failed[-1]); continue
        runs += res
        print(f"\n== world size {w} ({res[0]['backend']}, {time.perf_counter() - t:.1f} s)")
        print(f"{'setting':<7}{'strategy':<11}{'peak extra':>12}{'pred. peak':>12}{'gathered':>12}{'pred. bytes':>13}"
              f"{'max unit dev':>14}{'ms':>8}  allocator")
        for row in res[0]["rows"]:
            dev = row["unit_deviation"]
            alloc = row["allocator"]
            al = (f"max_allocated {fmt_bytes(alloc['max_memory_allocated'])}, max_reserved "
                  f"{fmt_bytes(alloc.get('max_memory_reserved'))}" if "max_memory_allocated" in alloc else "-")
            print(f"{row['setting']:<7}{row['strategy']:<11}{fmt_bytes(row['peak_extra']):>12}"
                  f"{fmt_bytes(row['predicted_peak']):>12}{fmt_bytes(row['bytes_gathered']):>12}"
                  f"{fmt_bytes(row['predicted_bytes']):>13}{'-' if dev is None else f'{dev:+.1%}':>14}"
                  f"{row['seconds'] * 1e3:>8.1f}  {al}")
    mem_rows, mem_problems = ([], []) if a.no_memory else memory_check(plat, worlds, a.batch, a.seq, a.timeout)
    result = dict(platform=dict(name=plat.name, device=plat.device_name, device_count=count, backend=plat.dist_backend,
                                detected_by=det.source),
                  versions=_versions(), layers=layers, hidden=hidden, world_sizes=worlds,
                  runs=runs, failed=failed, problems=problems(runs) + mem_problems, memory=mem_rows,
                  memory_skipped=on_cpu or a.no_memory, seconds=time.perf_counter() - t0)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "device_check.json"), "w") as f: json.dump(result, f, indent=1)
    print("\nsaved", os.path.join(a.out, "device_check.json"))
    if any(r["rows"] for r in runs):
        import matplotlib; matplotlib.use("Agg")
        fig = plot(result); path = os.path.join(a.out, "device_check.png"); fig.savefig(path, dpi=100)
        print("saved", path)
    for p in failed + result["problems"]: print("PROBLEM:", p)
    print(f"device check: {'OK' if not failed and not result['problems'] else 'PROBLEMS'} in {result['seconds']:.1f} s")
    return 0 if not failed and not result["problems"] else 1

if __name__ == "__main__":
    sys.exit(main())

"""Plan the default-size Qwen3-Omni (thinker 18.6 B + talker 3.35 B + code2wav 0.22 B) on the meta device, with LoRA on
the thinker: build seconds, plan seconds (FSDP1 and FSDP2), peak RSS. Target: planning adds <= 1 s to the build,
the whole run stays under 1 GB RSS. Writes bench/out/plan_qwen3_omni.png and prints the figures.

    python bench/plan.py [--r 8] [--targets q_proj,v_proj] [--min-num-params N]
"""
import argparse, json, os, resource, sys, time
from pathlib import Path


def rss_mib()->float:
    "Peak resident set size of this process so far, in MiB (Linux reports KiB)."
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--r", type=int, default=8)
    ap.add_argument("--targets", default="q_proj,v_proj")
    ap.add_argument("--min-num-params", type=int, default=0)
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "out"))
    a = ap.parse_args(argv)
    t0 = time.perf_counter()
    import torch
    from lora_fsdp_kit import models; from lora_fsdp_kit.plan import core as P, viz
    from lora_fsdp_kit.plan.wrap import WrapConfig
    t_import = time.perf_counter() - t0

    t0 = time.perf_counter()
    model = models.model_from_config("qwen3_omni_default")          # meta device: shapes only
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    model = models.add_lora(model, r=a.r, alpha=2 * a.r, target_modules=a.targets.split(","), modules="thinker")
    t_lora = time.perf_counter() - t0
    rss_built = rss_mib()

    t0 = time.perf_counter()
    cfg1 = WrapConfig(flavour="fsdp1", policy="lora", min_num_params=a.min_num_params, use_orig_params=a.min_num_params > 0)
    plan1 = cfg1.plan(model)
    findings1 = plan1.check()
    t_plan1 = time.perf_counter() - t0
    t0 = time.perf_counter()
    cfg2 = WrapConfig(flavour="fsdp2")                                 # fully_shard on each decoder layer
    plan2 = cfg2.plan(model)
    findings2 = plan2.check()
    t_plan2 = time.perf_counter() - t0

    t0 = time.perf_counter()
    out = Path(a.out); out.mkdir(parents=True, exist_ok=True)
    fig = viz.plot_plan(plan1); fig.savefig(out / "plan_qwen3_omni.png", dpi=110, bbox_inches="tight")
    fig2 = viz.plot_plan(plan2); fig2.savefig(out / "plan_qwen3_omni_fsdp2.png", dpi=110, bbox_inches="tight")
    t_png = time.perf_counter() - t0
    assert all(p.device.type == "meta" for p in model.parameters())

    figures = dict(params_b=round(plan1.numel / 1e9, 2), lora_params_m=round(plan1.lora_numel / 1e6, 2),
                   fsdp1_units=len(plan1), fsdp2_units=len(plan2), import_s=round(t_import, 2),
                   build_s=round(t_build, 2), add_lora_s=round(t_lora, 2), plan_fsdp1_s=round(t_plan1, 2),
                   plan_fsdp2_s=round(t_plan2, 2), png_s=round(t_png, 2), rss_after_build_mib=round(rss_built),
                   peak_rss_mib=round(rss_mib()),
                   fsdp1_findings={c: sum(f.check == c for f in findings1) for c in sorted({f.check for f in findings1})},
                   fsdp1_gather_peak=P.fmt_bytes(plan1.gather_peak_bytes),
                   fsdp2_gather_peak=P.fmt_bytes(plan2.gather_peak_bytes),
                   largest_unit=f"{plan1.largest_unit.name} ({P.fmt_bytes(plan1.largest_unit.nbytes)})")
    from lora_fsdp_kit.plan.text import plan_summary
    print(cfg1.label, "->", plan_summary(plan1)); print(cfg2.label, "->", plan_summary(plan2))
    for k, v in figures.items(): print(f"{k:>22}: {v}")
    ok = t_plan1 <= 1.0 and rss_mib() < 1024
    print("targets (plan <= 1 s, peak RSS < 1 GiB):", "met" if ok else "NOT met")
    return figures


if __name__ == "__main__":
    main()

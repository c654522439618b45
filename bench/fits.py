"""Speed and accuracy of `lora_fsdp_kit.fits` (issue 17), measured side by side in one run.

Speed (`--speed`, the default): predict a Llama-3-8B-shaped LoRA step at world 8 (FSDP2, bf16 mixed precision,
batch 1 x 512 tokens) and the default-size Qwen3-Omni thinker (18.6 B, its shipped config, bf16, `grouped_mm` experts)
at world 8; per model: wall seconds, traces, peak RSS of this process, and a cProfile of the first by cumulative time
(what takes the time, with `--profile`). Targets: 8B <= 60 s, thinker <= 5 min, RSS <= 2 GB. The machine is shared: the load average is
printed beside each figure.

Accuracy (`--matrix`): the full matrix the test samples -- 4 architectures (Llama, Qwen2, Qwen3-MoE, Qwen3-Omni thinker)
x FSDP1/FSDP2 x activation checkpointing on/off x fp32/bf16 at worlds 2 and 3 -- each real gloo rank's peak
(`lora_fsdp_kit.steppeak`, the CPU allocator's running total) beside the prediction; exit 1 when any is > 1 % off.

    python bench/fits.py [--speed] [--matrix] [--batch 2 --seq 256] [--out bench/out/fits]
"""
import argparse, cProfile, io, json, os, pstats, resource, sys, time

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out", "fits")
LLAMA3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], vocab_size=128256, hidden_size=4096,
                 intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                 head_dim=128, max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False,
                 dtype="bfloat16")

def rss_mib()->float: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def load()->str: return "load %.1f %.1f %.1f" % os.getloadavg()

def thinker_config()->dict:
    "The default-size Qwen3-Omni thinker alone: the shipped full config's thinker part, as its own model."
    from lora_fsdp_kit.models import shipped_config
    d = dict(shipped_config("qwen3_omni_default")["thinker_config"])
    d.update(architectures=["Qwen3OmniMoeThinkerForConditionalGeneration"], dtype="bfloat16")
    return d

def speed(name:str, cfg:dict, world:int, profile:bool)->dict:
    from lora_fsdp_kit.fits import predict_step_memory
    from lora_fsdp_kit.models import add_lora, model_from_config
    from lora_fsdp_kit.figures import fmt_bytes
    t0 = time.perf_counter()
    pm = add_lora(model_from_config(cfg, device="meta"), r=8)
    t_build = time.perf_counter() - t0
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof: prof.enable()
    m = predict_step_memory(pm, world=world, mixed_precision="bf16", batch=1, seq=512)
    if prof: prof.disable()
    secs = time.perf_counter() - t0
    row = dict(model=name, world=world, build_s=round(t_build, 1), predict_s=round(secs, 1), traces=len(m.traces),
               traced=m.traced_ranks, worst=m.worst, worst_text=fmt_bytes(m.worst), module=m.peak_module[0],
               phase=m.peak_phase[0], rss_mib=round(rss_mib()), load=load(),
               by_category={k: v for k, v in m.by_category[0].items() if v})
    print(f"{name}: world {world}, {len(m.traces)} trace(s) {m.traced_ranks if len(m.traces) < 4 else ''}: "
          f"predict {secs:.1f} s (build {t_build:.1f} s), worst peak {fmt_bytes(m.worst)} in {m.peak_module[0]} "
          f"({m.peak_phase[0]}), peak RSS {rss_mib():.0f} MiB, {load()}", flush=True)
    if prof:
        s = io.StringIO(); pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
        row["profile"] = s.getvalue(); print(s.getvalue()[:6000])
    return row

def matrix(batch:int, seq:int)->list[dict]:
    from lora_fsdp_kit.launch import launch
    from lora_fsdp_kit.steppeak import measure_steps
    from lora_fsdp_kit.fits import FitsError, predict_step_memory
    from lora_fsdp_kit.models import add_lora, model_from_config, shipped_config
    from lora_fsdp_kit.wrap import WrapConfig
    moe = dict(experts_implementation="batched_mm")   # grouped_mm has no fp32 meta kernel (fits says so)
    cases = []
    for m, ov in (("llama", {}), ("qwen2", {}), ("qwen3_moe", moe), ("qwen3_omni_thinker", moe)):
        for f in ("fsdp1", "fsdp2"):
            for ac in (False, True):
                for mp in (None, "bf16"):
                    w = dict(flavour=f, activation_checkpointing=ac, mixed_precision=mp)
                    # FSDP1 mixed precision with LoRA leaves as units fails for real (peft casts the input to the
                    # adapter's fp32 before FSDP casts the adapter to bf16): decoder-layer units, use_orig_params
                    if f == "fsdp1" and mp: w.update(policy="layer", use_orig_params=True)
                    cases.append(dict(model=m, overrides=ov, wrap=WrapConfig(**w).to_dict(), batch=batch, seq=seq))
    rows = []
    for world in (2, 3):
        t0 = time.perf_counter()
        real = launch(measure_steps, cases, nprocs=world, quiet=True, timeout=3600)
        t_real = time.perf_counter() - t0
        for i, c in enumerate(cases):
            pm = add_lora(model_from_config(dict(shipped_config(c["model"]), **c["overrides"]), device="meta"), r=8)
            t0 = time.perf_counter()
            try: pred = predict_step_memory(pm, world=world, wrap=WrapConfig.from_dict(c["wrap"]), batch=batch,
                                            seq=seq, backend="gloo").peak_bytes
            except FitsError as e: pred = str(e)
            got = [real[r][i].get("peak") for r in range(world)]
            dev = [p / g - 1 if isinstance(pred, list) and g else None for p, g in zip(pred, got)]
            rows.append(dict(world=world, model=c["model"], wrap=WrapConfig.from_dict(c["wrap"]).label, real=got,
                             predicted=pred, deviation=dev, predict_s=round(time.perf_counter() - t0, 1)))
            print(f"world {world} {c['model']:<19}{rows[-1]['wrap']:<46}" + "  ".join(
                f"r{r}: {g} vs {p} ({d:+.3%})" if d is not None else f"r{r}: {g} vs {pred}"
                for r, (g, p, d) in enumerate(zip(got, pred if isinstance(pred, list) else [None] * world, dev))),
                flush=True)
        print(f"world {world}: real ranks {t_real:.0f} s for {len(cases)} cases, {load()}", flush=True)
    return rows

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--speed", action="store_true"); ap.add_argument("--matrix", action="store_true")
    ap.add_argument("--batch", type=int, default=2); ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--only", default=None, help="speed: 'llama3_8b' or 'thinker'")
    ap.add_argument("--profile", action="store_true", help="speed: cProfile each prediction (slows it ~1.5x)")
    ap.add_argument("--out", default=OUT)
    a = ap.parse_args(argv)
    if not (a.speed or a.matrix): a.speed = True
    res, bad = {}, []
    if a.speed:
        res["speed"] = []
        if a.only in (None, "llama3_8b"): res["speed"].append(speed("Llama-3-8B-shaped", LLAMA3_8B, 8, a.profile))
        if a.only in (None, "thinker"): res["speed"].append(speed("Qwen3-Omni thinker (default size)",
                                                                  thinker_config(), 8, a.profile))
    if a.matrix:
        res["matrix"] = matrix(a.batch, a.seq)
        bad = [r for r in res["matrix"] if not isinstance(r["predicted"], list)
               or any(d is None or abs(d) > 0.01 for d in r["deviation"])]
        print(f"matrix: {len(res['matrix'])} configurations, {len(bad)} off by more than 1 %")
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "fits.json"), "w") as f: json.dump(res, f, indent=1, default=str)
    print("saved", os.path.join(a.out, "fits.json"))
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())

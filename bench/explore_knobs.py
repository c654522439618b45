"""How fast the explorer answers a knob, where the time goes, and how fast the "will it fit?" tab answers.

Drives `explore(...)` from code, as the browser's clicks do (the same callbacks), and times each answer:
- the plan tab on the default-size Qwen3-Omni (`qwen3_omni_default`): a knob to a configuration not seen before
  (planning, checks, tree, chart: each timed), and a knob set back to one seen before (kept);
- the "will it fit?" tab on the Llama-3-8B shape at world 8: the first trace, then each knob (batch, seq,
  precision, checkpointing: a new trace each), a knob set back (kept) and a device-memory change (redraw only).
Bounds (issue 33): a plan knob <= 1 s on the default-size Qwen3-Omni; a fits knob <= 2 s after the first trace.
The machine is shared: the load is printed beside the figures.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/explore_knobs.py [--skip-fits]
"""
import argparse, json, os, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"bench"))

def timed(fn)->float:
    t0 = time.perf_counter(); fn(); return time.perf_counter() - t0

def plan_knobs(ex)->None:
    from lora_fsdp_kit import explore as E
    parts = {}
    for name, f in (("plan", ex.make_plan), ):
        parts[name] = timed(f)
    plan = ex.make_plan()
    parts["check"] = timed(plan.check); fs = plan.check()
    parts["tree html"] = timed(plan._repr_html_)
    parts["chart"] = timed(lambda: E.plot_plan(plan, fs)._repr_png_())
    print("  where a new configuration's time goes: " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))
    steps = [("FSDP2", lambda: setattr(ex.flavour, "value", "fsdp2")),
             ("FSDP1", lambda: setattr(ex.flavour, "value", "fsdp1")),
             ("use_orig_params on", lambda: setattr(ex.use_orig_params, "value", True)),
             ("use_orig_params off", lambda: setattr(ex.use_orig_params, "value", False)),
             ("FSDP2 again", lambda: setattr(ex.flavour, "value", "fsdp2")),
             ("FSDP1 again", lambda: setattr(ex.flavour, "value", "fsdp1"))]
    new, kept = [], []
    ex.ahead = False                                   # cold: nothing computed ahead
    for name, act in steps[:4]:
        seen = len(ex._plans); t = timed(act); (new if len(ex._plans) > seen else kept).append(t)
        print(f"  knob {name:22s} {t:5.2f} s  ({'new configuration' if len(ex._plans) > seen else 'kept answer'})")
    print(f"plan knob on qwen3_omni_default, nothing ahead: a new configuration median {statistics.median(new):.2f} s "
          f"(max {max(new):.2f}), one seen before {max(kept):.3f} s at most")
    ex.ahead, ex._plans = True, {}; ex.refresh()      # as the app runs: the answers one click away computed ahead
    ex.flavour.value = "fsdp1"; ex.use_orig_params.value = False; ex.lora_leaves.value = True
    clicks = [("FSDP2", ex.flavour, "fsdp2"), ("LoRA leaves off", ex.lora_leaves, False),
              ("FSDP1", ex.flavour, "fsdp1"), ("use_orig_params on", ex.use_orig_params, True),
              ("size part on", ex.size_on, True), ("size part off", ex.size_on, False)]
    ts = []
    for name, w, v in clicks:
        t_wait = timed(lambda: [f.result() for f in list(ex._ahead.values())])   # the user's pause between clicks
        t = timed(lambda: setattr(w, "value", v)); ts.append(t)
        print(f"  knob {name:22s} {t:5.2f} s  (after a pause of {t_wait:.1f} s while its neighbours were computed)")
    print(f"plan knob on qwen3_omni_default, computed ahead: median {statistics.median(ts):.3f} s, max {max(ts):.3f} s;"
          f" bound 1 s: {'met' if max(ts) <= 1 else 'MISSED'}")

def fits_knobs(ex)->None:
    f = ex.fits
    t = timed(lambda: setattr(ex.tabs, "selected_index", 3))
    print(f"  first trace (tab opened): {t:.2f} s  {f.seconds}")
    steps = [("batch 2", f.batch, 2), ("seq 4096", f.seq, 4096), ("precision fp32, bf16 compute", f.precision,
             "fp32, bf16 compute"), ("checkpointing off", f.checkpointing, False), ("checkpointing on (a trace seen before)", f.checkpointing,
             True), ("device 40 GiB", f.device_gib, 40)]
    ts = []
    for name, w, v in steps:
        t = timed(lambda: setattr(w, "value", v)); ts.append(t)
        print(f"  knob {name:30s} {t:5.2f} s  predict {f.seconds.get('predict', 0):.2f} s, draw "
              f"{f.seconds.get('draw', 0):.2f} s  | {f.status.value[:90]}")
    print(f"fits knob, 8B at world 8: median {statistics.median(ts):.2f} s, max {max(ts):.2f} s; bound 2 s: "
          f"{'met' if max(ts) <= 2 else 'MISSED'}")

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--skip-fits", action="store_true")
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f} at start")
    from lora_fsdp_kit.explore import explore
    t0 = time.perf_counter(); ex = explore("qwen3_omni_default", ahead=False)
    print(f"explore('qwen3_omni_default'): built, planned and drawn in {time.perf_counter() - t0:.1f} s")
    plan_knobs(ex)
    if not args.skip_fits:
        from fits import LLAMA3_8B                     # bench/fits.py's Llama-3-8B shape
        with tempfile.TemporaryDirectory() as d:
            cfg = Path(d)/"config.json"; cfg.write_text(json.dumps(LLAMA3_8B))
            ex8 = explore(config=str(cfg)); ex8.flavour.value = "fsdp2"
            fits_knobs(ex8)
    print(f"load {os.getloadavg()[0]:.1f} at end")

"""How fast the explorer answers a knob, where the time goes, and how fast the "will it fit?" tab answers.

Drives `explore(...)` from code, as the browser's clicks do (the same callbacks), and times each answer:
- the plan tab on the default-size Qwen3-Omni (`qwen3_omni_default`): a knob to a configuration not seen before
  (planning, checks, tree, chart: each timed), and a knob set back to one seen before (kept);
- the "will it fit?" tab on the Llama-3-8B shape at world 8: the first trace, then each knob after the user's
  pause (the worker process traces the settings one change away meanwhile), one knob that is not among them (a
  trace now) and a device-memory change (redraw only).
Bounds (issue 33): a plan knob <= 1 s on the default-size Qwen3-Omni; a fits knob <= 2 s after the first trace.
The machine is shared: the load is printed beside the figures.

Run: OMP_NUM_THREADS=1 .venv/bin/python bench/explore_knobs.py [--skip-fits | --skip-plan] [--fits-ahead 3]
"""
import argparse, json, math, os, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"bench"))

def timed(fn)->float:
    t0 = time.perf_counter(); fn(); return time.perf_counter() - t0

def timed2(fn)->tuple[float, float]:
    "Wall seconds and this thread's CPU seconds (what an idle machine would take) of `fn()`."
    t0, c0 = time.perf_counter(), time.thread_time(); fn(); return time.perf_counter() - t0, time.thread_time() - c0

def plan_knobs(ex)->None:
    from lora_fsdp_kit.plan import viz
    from lora_fsdp_kit.explore.fits import figure_svg
    parts, plan = {}, ex.make_plan()
    parts["plan"] = timed2(ex.make_plan)[1]
    parts["check"] = timed2(plan.check)[1]; fs = plan.check()
    parts["figure"] = timed2(lambda: viz.plot_plan(plan, fs))[1]; fig = viz.plot_plan(plan, fs)
    parts["its SVG"] = timed2(lambda: figure_svg(fig))[1]
    parts["(as a PNG)"] = timed2(lambda: viz.plot_plan(plan, fs)._repr_png_())[1] - parts["figure"]
    parts["(tree html, made when its tab is shown)"] = timed2(plan._repr_html_)[1]
    print("  where a new configuration's CPU time goes: " + ", ".join(f"{k} {v:.2f} s" for k, v in parts.items()))
    steps = [("FSDP2", lambda: setattr(ex.flavour, "value", "fsdp2")),
             ("FSDP1", lambda: setattr(ex.flavour, "value", "fsdp1")),
             ("use_orig_params on", lambda: setattr(ex.use_orig_params, "value", True)),
             ("use_orig_params off", lambda: setattr(ex.use_orig_params, "value", False))]
    new, kept = [], []
    ex.ahead = False                                   # cold: nothing computed ahead
    for name, act in steps:
        seen = len(ex._plans); (t, c) = timed2(act); (new if len(ex._plans) > seen else kept).append((t, c))
        print(f"  knob {name:22s} {t:5.2f} s wall, {c:5.2f} CPU-s  "
              f"({'new configuration' if len(ex._plans) > seen else 'kept answer'})")
    print(f"plan knob on qwen3_omni_default, nothing ahead: a new configuration median "
          f"{statistics.median(t for t, _ in new):.2f} s wall, {statistics.median(c for _, c in new):.2f} CPU-s "
          f"(the idle machine's wall; max {max(c for _, c in new):.2f}), one seen before {max(t for t, _ in kept):.3f} s")
    ex.ahead, ex._plans = True, {}; ex.refresh()      # as the app runs: the answers one click away computed ahead
    ex.flavour.value = "fsdp1"; ex.use_orig_params.value = False; ex.lora_leaves.value = True
    step_left = lambda: 10 ** (math.log10(ex.min_num_params.value) - ex.min_num_params.step)
    clicks = [("FSDP2", ex.flavour, lambda: "fsdp2"), ("LoRA leaves off", ex.lora_leaves, lambda: False),
              ("FSDP1", ex.flavour, lambda: "fsdp1"), ("use_orig_params on", ex.use_orig_params, lambda: True),
              ("size part on", ex.size_on, lambda: True), ("slider one step left", ex.min_num_params, step_left),
              ("size part off", ex.size_on, lambda: False)]
    ts = []
    for name, w, v in clicks:
        t_wait = timed(lambda: [f.result() for f in list(ex._ahead.values())])   # the user's pause between clicks
        t, c = timed2(lambda: setattr(w, "value", v())); ts.append(t)
        print(f"  knob {name:22s} {t:5.2f} s wall, {c:5.2f} CPU-s  (after a pause of {t_wait:.1f} s while its "
              "neighbours were computed)")
    print(f"plan knob on qwen3_omni_default, computed ahead: median {statistics.median(ts):.3f} s, max {max(ts):.3f} s;"
          f" bound 1 s: {'met' if max(ts) <= 1 else 'MISSED'}")
    # a click that was not computed ahead, while the work ahead runs: it goes first (the work pauses between steps)
    classes = ex.layer_classes.options
    out = []
    for pick in (classes[:1], classes[:2], classes[:3]):
        ex.refresh(); time.sleep(ahead_delay() + 0.3)       # the work ahead has begun
        busy = any(f.running() for f in ex._ahead.values())
        t, c = timed2(lambda: setattr(ex.layer_classes, "value", tuple(pick))); out.append(t)
        print(f"  layer classes {len(pick)} (not ahead{', while the work ahead runs' if busy else ''}) "
              f"{t:5.2f} s wall, {c:5.2f} CPU-s")
    print(f"a click not computed ahead, during the work ahead: max {max(out):.2f} s wall")

def fits_knobs(ex)->None:
    f = ex.fits
    t = timed(lambda: setattr(ex.tabs, "selected_index", 3))
    print(f"  first trace (tab opened): {t:.2f} s  {f.seconds}")
    def pause()->float:                                # the user's pause: the worker traces the neighbours
        t0 = time.perf_counter()
        while f._queue or f._running:
            if r := f._running: r[1].result()
            time.sleep(0.05)
        return time.perf_counter() - t0
    steps = [("batch 2", f.batch, 2), ("seq 4096", f.seq, 4096), ("checkpointing off", f.checkpointing, False),
             ("batch 3 (not a neighbour)", f.batch, 3), ("device 40 GiB", f.device_gib, 40)]
    knob_of = {id(f.batch): "batch", id(f.seq): "seq", id(f.world): "world", id(f.precision): "precision",
               id(f.checkpointing): "ckpt"}
    ts = []
    for name, w, v in steps:
        waited = pause() if "not a neighbour" not in name else 0.0
        redraw = id(w) not in knob_of
        ahead = not redraw and f.key(dict(f.setting(), **{knob_of[id(w)]: v})) in f._traces
        t = timed(lambda: setattr(w, "value", v)); ts.append((t, ahead or redraw))
        how = "traced ahead" if ahead else "redraw only" if redraw else "traced now"
        print(f"  knob {name:30s} {t:5.2f} s  ({how}; after a pause of {waited:.1f} s)  | {f.status.value[:80]}")
    kept = [t for t, a in ts if a]
    print(f"fits knob, 8B at world 8: traced ahead or redraw: max {max(kept):.2f} s; traced now: "
          f"{', '.join(f'{t:.1f}' for t, a in ts if not a) or 'none'} s; bound 2 s after the first trace: "
          f"{'met' if max(kept) <= 2 else 'MISSED'} for the settings one change away")

def ahead_delay()->float:
    from lora_fsdp_kit.explore import core as E
    return E.AHEAD_DELAY_S

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--skip-fits", action="store_true")
    ap.add_argument("--skip-plan", action="store_true")
    ap.add_argument("--fits-ahead", type=int, default=3, help="settings the worker traces ahead (the app: 9)")
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f} at start")
    from lora_fsdp_kit.explore.core import explore
    if not args.skip_plan:
        t0 = time.perf_counter(); ex = explore("qwen3_omni_default", ahead=False)
        print(f"explore('qwen3_omni_default'): built, planned and drawn in {time.perf_counter() - t0:.1f} s")
        plan_knobs(ex)
    if not args.skip_fits:
        from fits import LLAMA3_8B                     # bench/fits.py's Llama-3-8B shape
        with tempfile.TemporaryDirectory() as d:
            cfg = Path(d)/"config.json"; cfg.write_text(json.dumps(LLAMA3_8B))
            ex8 = explore(config=str(cfg)); ex8.flavour.value = "fsdp2"; ex8.fits.n_ahead = args.fits_ahead
            fits_knobs(ex8)
    print(f"load {os.getloadavg()[0]:.1f} at end")

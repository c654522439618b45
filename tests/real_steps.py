"""Real ranks measured while this process traces: the step peaks that tests/test_fits_accuracy.py and
tests/test_fits_beyond.py hold `predict_step_memory` to (`steppeak.measure_steps` on gloo ranks)."""
import multiprocessing, threading, time

from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.steppeak import measure_steps

def measure_while_predicting(specs:list[dict], worlds:list[int], nprocs:int, predict, repeat:int=1)->list[list]:
    """`measure_steps` of every spec in one launch of `nprocs` ranks (in a thread), while this process calls
    `predict(i)` for each spec (an error is left to that case's test): per spec, the peaks (or errors) of its ranks;
    with `repeat`, each spec is measured that many times and each rank's lowest reading kept (a gloo worker may free a
    collective's buffer late: a reading above the step's own peak, seen once in a few runs)."""
    box = {}
    def run():
        try: box["res"] = launch(measure_steps, specs * repeat, nprocs=nprocs, quiet=True, timeout=600)
        except BaseException as e: box["error"] = e
    t = threading.Thread(target=run, daemon=True); t.start()
    t0 = time.monotonic()   # the trace makes a fake process group here: let `launch` spawn first
    while not multiprocessing.active_children() and t.is_alive() and time.monotonic() - t0 < 120: time.sleep(0.05)
    for i in range(len(specs)):
        try: predict(i)
        except Exception: pass
    t.join()
    if "error" in box: raise box["error"]
    def reading(r:int, i:int):
        got = [box["res"][r][i + k * len(specs)] for k in range(repeat)]
        bad = next((g.get("error") for g in got if "peak" not in g), None)
        return bad if bad is not None else min(g["peak"] for g in got)
    return [[reading(r, i) for r in range(w)] for i, w in enumerate(worlds)]

def assert_in_range(name:str, got:list, pred)->None:
    "Every rank's measured peak in [predicted peak - 1 %, worst peak + 1 %] (a late-freed all-gather may count or not)."
    assert all(isinstance(g, int) for g in got), got
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        print(f"{name} rank {r}: measured {g:,}, peak {t.peak / g - 1:+.3%}, worst {t.worst_peak / g - 1:+.3%}")
        assert t.peak * 0.99 <= g <= t.worst_peak * 1.01, (
            f"rank {r}: measured {g:,}, predicted {t.peak:,} ({t.peak / g - 1:+.3%}) to {t.worst_peak:,} "
            f"({t.worst_peak / g - 1:+.3%}), {pred.label}")

"""Real ranks measured while this process traces: the step peaks that tests/test_fits_beyond.py holds
`predict_step_memory` to (`steppeak.measure_beside`: `steppeak.measure_steps` on gloo ranks)."""
from lora_fsdp_kit.fits.steppeak import measure_beside

def measure_while_predicting(specs:list[dict], worlds:list[int], nprocs:int, predict, repeat:int=1)->list[list]:
    """`measure_beside` of specs whose worlds are given apart, in one launch of `nprocs` ranks, while this process
    calls `predict(i)` for each spec (an error is left to that case's test): per spec, the peaks (or errors) of its
    ranks, each rank's lowest of `repeat` readings."""
    return measure_beside([dict(s, world=w) for s, w in zip(specs, worlds)], predict, repeat=repeat, nprocs=nprocs)

def assert_in_range(name:str, got:list, pred)->None:
    "Every rank's measured peak in [predicted peak - 1 %, worst peak + 1 %] (a late-freed all-gather may count or not)."
    assert all(isinstance(g, int) for g in got), got
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        print(f"{name} rank {r}: measured {g:,}, peak {t.peak / g - 1:+.3%}, worst {t.worst_peak / g - 1:+.3%}")
        assert t.peak * 0.99 <= g <= t.worst_peak * 1.01, (
            f"rank {r}: measured {g:,}, predicted {t.peak:,} ({t.peak / g - 1:+.3%}) to {t.worst_peak:,} "
            f"({t.worst_peak / g - 1:+.3%}), {pred.label}")

def assert_exact(name:str, got:list, pred, tol:float=0.001)->None:
    """Every rank's measured peak within `tol` of its predicted `peak`; or, where a gloo worker freed an all-gather's
    buffer late (the one thing `worst_peak` adds, seen about 1 run in 30), within `tol` of its `worst_peak`. Either
    way the reading is the prediction's to the byte range, never somewhere between."""
    assert all(isinstance(g, int) for g in got), got   # an error would be the rank's traceback
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        late = t.worst_peak > t.peak and abs(t.worst_peak / g - 1) <= tol < abs(t.peak / g - 1)
        print(f"{name} rank {r}: measured {g:,}, predicted {t.peak:,} ({t.peak / g - 1:+.4%})"
              + (f", at its worst_peak {t.worst_peak:,} (an all-gather freed late)" if late else ""))
        assert late or abs(t.peak / g - 1) <= tol, (
            f"rank {r}: predicted {t.peak:,}, measured {g:,} ({t.peak / g - 1:+.3%}; worst_peak {t.worst_peak:,}), "
            f"{pred.label}")

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

GLOO_SLACK = 64   # bytes: a gloo worker's own small allocations beside a late-freed buffer (worst_peak + 12 B seen)

def assert_exact(name:str, got:list, pred, tol:float=0.001)->None:
    """Every rank's measured peak within `tol` of its predicted `peak`; or, where a gloo worker freed an all-gather's
    output late, inside [peak, worst_peak] (`worst_peak` adds the largest unit's; under load a smaller unit's was seen
    too: -3.1 % and -6.5 % from `peak`, both inside), a gloo thread's few bytes (`GLOO_SLACK`) aside. At least one
    rank of the case at its `peak`: the step's own reading, to the byte range."""
    assert all(isinstance(g, int) for g in got), got   # an error would be the rank's traceback
    exact = []
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        ok = abs(t.peak / g - 1) <= tol
        late = not ok and t.worst_peak > t.peak and t.peak <= g <= t.worst_peak + GLOO_SLACK
        print(f"{name} rank {r}: measured {g:,}, predicted {t.peak:,} ({t.peak / g - 1:+.4%})"
              + (f", inside [peak, worst_peak {t.worst_peak:,}] (an all-gather freed late)" if late else ""))
        assert ok or late, (
            f"rank {r}: predicted {t.peak:,}, measured {g:,} ({t.peak / g - 1:+.3%}; worst_peak {t.worst_peak:,}), "
            f"{pred.label}")
        exact.append(ok)
    assert any(exact), f"no rank at its predicted peak ({pred.label}): measured {got}"

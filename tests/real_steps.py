"""Real ranks measured while this process traces: the step peaks that tests/test_fits_accuracy.py and
tests/test_fits_beyond.py hold `predict_step_memory` to (`fits_check.measure_beside`: `steppeak.measure_steps` on
gloo ranks)."""
from lora_fsdp_kit.fits_check import measure_beside

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

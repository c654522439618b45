"""The committed sweep (bench/fits_sweep.json, issue 46 item 3) still holds: a few of its rows, drawn with the git HEAD
as the seed (a different sample on every commit), run again on real gloo ranks (`steppeak`, the CPU allocator's
running total) beside `predict_step_memory`: a row the table calls exact within ±0.1 % on every rank, a row it labels
not exact no further from the real ranks than its committed error (±0.1 %). LFK_SWEEP_SEED picks the sample by hand."""
import json, os, random, subprocess
from pathlib import Path

import pytest

from lora_fsdp_kit.fits.check import SETTINGS, predict_fresh
from lora_fsdp_kit.fits.steppeak import EXACT, _compared, check_case, measure_beside
from lora_fsdp_kit.plan.wrap import WrapConfig

ROOT = Path(__file__).resolve().parent.parent
TABLE = json.loads((ROOT / "bench" / "fits_sweep.json").read_text())
N = 3   # rows per run: one launch of at most 3 ranks, within 60 s on 2 cores

def _seed()->int:
    "The sample's seed: LFK_SWEEP_SEED, else the commit (git rev-parse HEAD), else 0."
    if os.environ.get("LFK_SWEEP_SEED"): return int(os.environ["LFK_SWEEP_SEED"])
    try: return int(subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                   check=True).stdout.strip()[:8], 16)
    except Exception: return 0

def sample(seed:int, n:int=N)->list[dict]:
    "`n` rows the sweep ran, drawn with `seed`, at world 2 unless the draw holds only world-3 rows."
    ran = [r for r in TABLE["rows"] if "error" in r and r["setting"] in SETTINGS]
    return random.Random(seed).sample(sorted(ran, key=lambda r: (r["arch"], r["setting"], r["world"])),
                                      min(n, len(ran)))

ROWS = sample(_seed())

@pytest.fixture(scope="module")
def real():
    "Each sampled row measured on real ranks while this process predicts it (one launch)."
    meta = TABLE["meta"]
    cases = [check_case(r["arch"], WrapConfig(**SETTINGS[r["setting"]]), r["world"], meta["batch"], meta["seq"],
                        experts=meta.get("experts"))
             for r in ROWS]
    preds = {}
    def predict(i): preds[i] = predict_fresh(cases[i])   # as the sweep, and `lfk fits`: a fresh process each
    got = measure_beside(cases, predict, timeout=300, repeat=2)   # the lower of 2 readings, as the sweep
    return [(preds.get(i), g) for i, g in enumerate(got)]

def band(row:dict)->tuple[float, float]:
    "The error a row may show: ±0.1 % if the table calls it exact, else between 0 and its committed error, ±0.1 %."
    e = row["error"]
    return (-EXACT, EXACT) if abs(e) <= EXACT else (min(e, 0) - EXACT, max(e, 0) + EXACT)

@pytest.mark.parametrize("i", range(len(ROWS)), ids=[f"{r['arch']}-{r['setting']}-w{r['world']}" for r in ROWS])
def test_sampled_row_within_its_committed_band(real, i):
    row, (pred, got) = ROWS[i], real[i]
    assert all(isinstance(g, int) for g in got), got
    assert pred is not None, "the prediction failed"
    fc = _compared(pred, got, row["arch"])
    lo, hi = band(row)
    # a rank whose reading is its worst_peak (a gloo all-gather freed late by its worker: the one thing worst_peak
    # bounds, seen on 1 run in 3 here) says nothing of `peak`: its reading is held to worst_peak instead
    ranks = list(zip(fc.peak, fc.worst_peak, fc.measured))
    late = [r for r, (p, w, m) in enumerate(ranks) if w > p and abs(m / w - 1) <= EXACT and not lo <= p / m - 1 <= hi]
    errors = [p / m - 1 for r, (p, w, m) in enumerate(ranks) if r not in late]
    print(f"{row['arch']} {row['setting']} world {row['world']}: committed {row['error']:+.3%}, now "
          f"{[f'{e:+.3%}' for e in errors]}" + (f", ranks {late} at their worst_peak (a late-freed all-gather)"
                                                if late else ""))
    assert all(lo <= e <= hi for e in errors), (
        f"{row['arch']} / {row['setting']} / world {row['world']}: peak {errors} against real ranks, the committed "
        f"table allows [{lo:+.3%}, {hi:+.3%}]; re-run bench/fits_sweep.py --arch {row['arch']} --redo if fits changed")

def test_the_sample_changes_with_the_seed():
    "Two commits draw different rows (the table has many), and a seed draws the same rows every time."
    assert sample(1) == sample(1)
    assert sample(1) != sample(2) or len([r for r in TABLE["rows"] if "error" in r]) <= N

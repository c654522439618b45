"""`fits --max-batch`'s search answers exactly what tracing every batch in turn answers: the largest batch whose traced
worst case fits, with that batch and the next traced for every rank. Its shortcuts (a line through two peaks, one
rank's trace as a guide) only choose what to trace; a shortcut that decided the answer would fail here. FSDP1 with
use_orig_params at world 3: every rank traces apart, so the guide (one rank) is cheaper than a value's trace."""
import functools

from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.fits.core import predict_step_memory
from lora_fsdp_kit.fits.report import _search, largest_fitting
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.plan.wrap import WrapConfig

CFG = WrapConfig(flavour="fsdp1", policy="layer", use_orig_params=True, mixed_precision="bf16")
WORLD, SEQ = 3, 16

@functools.cache
def model(): return add_lora(model_from_config(shipped_config("llama"), device="meta"))

@functools.cache
def traced(batch:int, rank:int|None=None):
    "Every rank's prediction at `batch` (or one rank's)."
    return predict_step_memory(model(), world=WORLD, wrap=CFG, batch=batch, seq=SEQ, rank=rank)

def scan(usable:int, upto:int=6)->int:
    "The answer by tracing every batch in turn: the largest that fits (the next one traced too)."
    best = 0
    for n in range(1, upto + 1):
        if traced(n).worst_case > usable: return best
        best = n
    raise AssertionError(f"batch {upto} fits too: widen the scan")

def test_search_answers_what_a_scan_answers():
    "The device sized to batch 4's worst case: the search says 4, with batch 4's and 5's worst cases, as the scan."
    assert len({traced(4).worst_peak_bytes[r] for r in range(WORLD)}) == WORLD   # the ranks differ: a guide is cheaper
    usable = traced(4).worst_case
    best, seen, m = _search(model(), CFG, WORLD, 1, SEQ, "config", "base", "nccl", "auto", None, usable, "batch")
    assert best == scan(usable) == 4 and m.worst_case == traced(4).worst_case and len(m.ranks) == WORLD
    assert (seen[4], seen[5]) == (traced(4).worst_case, traced(5).worst_case) and seen[5] > usable
    best, seen, _ = _search(model(), CFG, WORLD, 1, SEQ, "config", "base", "nccl", "auto", None, usable - 1, "batch")
    assert best == scan(usable - 1) == 3 and seen[4] == traced(4).worst_case   # a byte less: 3, and 4 traced whole

def test_a_guide_below_the_worst_rank_does_not_decide():
    "A guide from the rank with the lowest peak: at batch 4 it fits where the worst rank does not; the answer is 3."
    worst = traced(4).worst_peak_bytes
    low = min(range(WORLD), key=worst.__getitem__)
    usable = (worst[low] + max(worst)) // 2   # between: the guide's batch 4 fits, the worst rank's does not
    guided = []
    def guide(n): guided.append(n); return traced(n, low).worst_case
    best, seen = largest_fitting(lambda n: traced(n).worst_case, usable, guide=guide)
    assert best == scan(usable) == 3 and guided, guided
    assert seen[3] == traced(3).worst_case <= usable < seen[4] == traced(4).worst_case

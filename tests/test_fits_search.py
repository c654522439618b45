"""`fits --max-batch`'s search answers exactly what tracing every batch in turn answers: the largest batch whose traced
worst case fits (every rank traced at it), and a next batch that does not fit, by every rank's trace or by rank 0's
alone (a lower bound of every rank's: its "no" is certain, and the answer says whose it is). Its shortcuts (a line
through two peaks or through each op's bytes, one rank's trace as a guide) only choose what to trace; a shortcut that
decided a "fits" would fail here. FSDP1 with use_orig_params at world 3: every rank traces apart, so the guide (one
rank) is cheaper than a value's trace. The settings searched side by side in forked copies answer what they answer
one after the other, a refused one included, and nothing is traced again in the parent."""
import functools

from lora_fsdp_kit import forks
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.fits import report, search as searching
from lora_fsdp_kit.fits.core import predict_step_memory
from lora_fsdp_kit.fits.report import _searched, fits_report
from lora_fsdp_kit.fits.search import largest_fitting, search_setting
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

def search(usable:int):
    return search_setting(model(), CFG, WORLD, 1, SEQ, "config", "base", "nccl", "auto", None, usable, "batch")

def test_search_answers_what_a_scan_answers():
    "The device sized to batch 4's worst case: the search says 4, batch 4 traced for every rank, 5 over the device."
    assert len({traced(4).worst_peak_bytes[r] for r in range(WORLD)}) == WORLD   # the ranks differ: a guide is cheaper
    usable = traced(4).worst_case
    best, seen, lower, m = search(usable)
    assert best == scan(usable) == 4 and m.worst_case == traced(4).worst_case and len(m.ranks) == WORLD
    assert 4 not in lower and seen[4] == traced(4).worst_case
    # the next batch: every rank's peak, or rank 0's alone (a bound below every rank's), over the device either way
    assert seen[5] == (traced(5, 0) if 5 in lower else traced(5)).worst_case > usable
    assert traced(5, 0).worst_case <= traced(5).worst_case
    best, seen, lower, _ = search(usable - 1)
    assert best == scan(usable - 1) == 3 and seen[3] == traced(3).worst_case and 3 not in lower   # a byte less: 3

def test_the_next_value_by_rank_0_alone_is_said_so():
    "Sized to batch 4, FSDP1's rank 0 alone says no at 5 (one rank's trace, not 3): the answer line says whose peak."
    usable = traced(4).worst_case
    best, seen, lower, _ = search(usable)
    assert traced(5, 0).worst_case > usable and 5 in lower, (seen, lower)   # the guide's "no" decided, cheaply
    line = _searched({0: (best, seen, lower)}, "batch", usable)[0]
    assert "largest batch 4: " in line and " on rank 0 alone (" in line, line
    assert " on rank 0 alone" not in _searched({0: (best, seen, lower - {5})}, "batch", usable)[0]

def test_a_guide_below_the_worst_rank_does_not_decide():
    "A guide from the rank with the lowest peak: at batch 4 it fits where the worst rank does not; the answer is 3."
    worst = traced(4).worst_peak_bytes
    low = min(range(WORLD), key=worst.__getitem__)
    usable = (worst[low] + max(worst)) // 2   # between: the guide's batch 4 fits, the worst rank's does not
    guided = []
    def guide(n): guided.append(n); return traced(n, low).worst_case
    best, seen, lower = largest_fitting(lambda n: traced(n).worst_case, usable, guide=guide)
    assert best == scan(usable) == 3 and guided, guided
    assert seen[3] == traced(3).worst_case <= usable < seen[4] == traced(4).worst_case and 4 not in lower

def test_settings_side_by_side_answer_as_one_after_the_other(monkeypatch, capfd):
    "A setting and a refused one, in forked copies: the same answer as in this process; nothing traced here."
    refused = WrapConfig(flavour="fsdp1", policy="lora", mixed_precision="bf16")   # LoRA leaves, bf16: FSDP refuses
    wraps = [refused, WrapConfig(mixed_precision="bf16")]
    def answer(copies:int)->tuple[int, str]:
        monkeypatch.setenv(forks.ENV, str(copies))
        rc = fits_report("llama", world=WORLD, device_memory=traced(4).worst_case, reserve="0B", seq=str(SEQ),
                         wraps=wraps, max_batch=True)
        return rc, capfd.readouterr()
    rc0, (out0, err0) = answer(0)
    probes, probe = [], searching.probe
    counted = lambda *a, **k: probes.append(a) or probe(*a, **k)
    for mod in (searching, report): monkeypatch.setattr(mod, "probe", counted)   # a search's traces, a row's
    rc2, (out2, err2) = answer(2)
    assert forks.copies() == 2 and not probes, len(probes)   # every trace ran in a copy, the refusal's too
    assert rc0 == rc2 == 1 and out0 == out2, out0 + "\n----\n" + out2
    assert out2.count("cannot predict fsdp1:lora") == 1 and "1: largest batch " in out2, out2
    assert all(err.count("  traced ") == 2 for err in (err0, err2)), err2   # each setting's progress line, once

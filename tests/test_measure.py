"""Every prediction `measure_gather` prints holds against the measurement on real gloo ranks: the bytes all-gathered
exactly (FSDP1 flat parameters and FSDP2 dims 0 padded to the shard group, also unit by unit), the peak extra memory
as the bound it prints (measured ≤ predicted) — FSDP1 and FSDP2, LoRA-leaf and decoder-layer units, every strategy,
uneven sizes (r=1 on 2 and 3 ranks, hidden 64 r=8 at 3 ranks). Issue 19, item 7: FSDP2 `per_unit` with LoRA-leaf
units ignored the padding (+57 % at 2 ranks, +116 % at 3)."""
import os, sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import measure_cases as C
from lora_fsdp_kit.launch import launch

STRATEGIES = {"fsdp1": ("packed", "per_unit", "whole"), "fsdp2": ("packed", "per_unit", "lora_only", "whole")}
CASES = [(f, pol, s, 48, 1) for f in STRATEGIES for pol in ("peft", "layer") for s in STRATEGIES[f]]
EXTRA3 = [("fsdp2", pol, "packed", 64, 8) for pol in ("peft", "layer")]

@pytest.fixture(scope="module", params=[2, 3])
def rows(request):
    world = request.param
    ranks = launch(C.predictions, CASES + (EXTRA3 if world == 3 else []), nprocs=world, quiet=True, timeout=900)
    return [dict(r, rank=k, world=world) for k, rs in enumerate(ranks) for r in rs]

def test_bytes_exact(rows):
    bad = [(r["world"], r["rank"], r["case"], r["bytes"], r["predicted_bytes"]) for r in rows
           if r["bytes"] != r["predicted_bytes"]]
    assert not bad, bad

def test_unit_bytes_exact(rows):
    bad = [(r["world"], r["case"], u) for r in rows for u in r["units"] if u[2] is not None and u[1] != u[2]]
    assert not bad, bad[:10]

def test_peak_within_printed_bound(rows):
    # no slack: the packed bound counts the send buffer that gloo's worker may still hold while the output is
    # unpacked (the 1.3 KiB at r=1 and the 11,904 B at 3 ranks that runs measured now and then)
    bad = [(r["world"], r["rank"], r["case"], r["peak"], r["predicted_peak"]) for r in rows
           if r["peak"] > r["predicted_peak"]]
    assert not bad, bad

"""The shard arithmetic of `lora_fsdp_kit.shards`, read through `lora_fsdp_kit.gather.sharded`, against the real placements of
FSDP1 and FSDP2 on 1 to 4 gloo ranks: every rank's piece of every parameter equals the slice the layout names (and the
tensor FSDP itself puts on the module), the pieces of all ranks reassemble with `torch.cat` to the full tensor, the
shard groups and padded sizes equal FSDP's; uneven sizes, alignment padding, dim-1 placements and hybrid meshes."""
import os, sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import gather_layouts as GL
from lora_fsdp_kit.launch import launch

CASES = [dict(flavour="fsdp1"), dict(flavour="fsdp1", orig=True), dict(flavour="fsdp2"),
         dict(flavour="fsdp2", dim1=True), dict(flavour="fsdp1", hybrid=True), dict(flavour="fsdp1", orig=True,
         hybrid=True), dict(flavour="fsdp2", hybrid=True), dict(flavour="fsdp2", dim1=True, hybrid=True)]

@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_pieces_match_fsdp(world):
    res = launch(GL.layouts_cases, CASES, nprocs=world, quiet=True, timeout=600)
    ran = [c for r in res for c in r]
    assert len(ran) == world * (len(CASES) if world == 4 else 4), len(ran)
    for c in ran:
        assert not c["bad"], c
        assert c["n_params"] == 8, c
    dims = {tuple(c["dims"]) for c in ran if c.get("dim1")}
    if world > 0: assert all(1 in d for d in dims), dims   # dim 1 really used (12 divides by 1..4, 7 by 1)

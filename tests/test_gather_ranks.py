"""Beyond 2 ranks: on 3 gloo ranks (uneven shards: FSDP1 flat parameters and FSDP2 dim-0 shards padded), on 4 ranks as
2 x 2 hybrid sharding (FSDP1 HYBRID_SHARD and _HYBRID_SHARD_ZERO2, FSDP2 on a replicate x shard mesh: each shard group
gathers within itself) and on 1 rank (FSDP1 switches to NO_SHARD), gather_lora equals peft's state dict of the
unwrapped model bit for bit after a few optimizer steps, in one collective of exactly the bytes the plan predicts
(LoRA + padding, no base weight); the merged stream equals peft's merge_and_unload()."""
import os, sys, time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import gather_cases as C
import gather_checks as K
from lora_fsdp_kit.launch import launch

# every setting under peft's policy, the other policies once each, and the tied / modules_to_save variants where
# padding differs most (kept small: each case at 3 ranks costs CI time; 2 ranks run the full matrix)
THREE = ([dict(model="llama", setting=s, policy="peft") for s in C.SETTINGS]
         + [dict(model="llama", setting="fsdp1-orig", policy="layer"), dict(model="llama", setting="fsdp1", policy="root")]
         + [dict(model="llama", setting="fsdp2", policy="layer", **v)
            for v in (dict(tied=True), dict(modules_to_save=("lm_head",)))])
HYBRID = [dict(model="llama", setting=s, policy=k, sharding=h) for s, k, h in (
          ("fsdp1", "peft", "HYBRID_SHARD"), ("fsdp1-orig", "layer", "HYBRID_SHARD"),
          ("fsdp1-orig", "layer", "_HYBRID_SHARD_ZERO2"), ("fsdp2", "layer", "HYBRID"))]
ONE = [dict(model="llama", setting=s, policy=k) for s, k in (("fsdp1", "peft"), ("fsdp1-orig", "layer"), ("fsdp2", "layer"))]

def _run(cases, nprocs, profile=False):
    t0 = time.perf_counter()
    res = launch(C.run_matrix, cases, False, profile, nprocs=nprocs, quiet=True, timeout=900)
    print(f"{len(cases)} cases on {nprocs} ranks in {time.perf_counter() - t0:.1f} s")
    return res

@pytest.fixture(scope="module")
def three_res(): return _run(THREE, 3, True)

@pytest.fixture(scope="module")
def hybrid_res(): return _run(HYBRID, 4, "HYBRID_SHARD")

@pytest.fixture(scope="module")
def three(three_res): return K.rows_of(three_res)

@pytest.fixture(scope="module")
def hybrid(hybrid_res): return K.rows_of(hybrid_res)

@pytest.fixture(scope="module")
def one(): return K.rows_of(_run(ONE, 1))

@pytest.mark.parametrize("world", ["three", "hybrid", "one"])
def test_equal_to_peft_one_collective(world, request):
    rows = request.getfixturevalue(world)
    K.assert_no_errors(rows)
    K.assert_refusals_are_fsdp1_mixed_grad(rows)
    assert len(K.ran(rows)) >= len(rows) * 2 // 3, "most configurations must run"
    K.assert_equal_to_peft(rows)
    K.assert_one_collective_lora_bytes(rows)

def test_three_ranks_pad(three):
    # 3 does not divide the tiny models' dims: FSDP2 pads dim 0, and the bytes include that padding exactly
    fsdp2 = [r for r in K.ran(three) if r["setting"] == "fsdp2"]
    assert any(r["padded_bytes"] > r["lora_bytes"] for r in fsdp2)
    assert all(r["bytes_gathered"] in (r["padded_bytes"], r["lora_bytes"]) for r in fsdp2)

def test_hybrid_gathers_within_the_shard_group(hybrid):
    rows = K.ran(hybrid)
    assert {r["sharding"] for r in rows} == {"HYBRID_SHARD", "_HYBRID_SHARD_ZERO2", "HYBRID"}
    assert all(r["shard_world"] == 2 for r in rows)   # 2 x 2: the shard group is 2 ranks, not 4
    # ranks 2 and 3 (the other replica) gather among themselves, and take no part in rank0_only
    assert all(r["rank0_only_bytes"] == 0 for r in rows if r["rank"] >= 2)

def test_one_rank_needs_no_collective(one):
    assert all(r["shard_world"] == 1 and r["collectives"] == 0 for r in K.ran(one))
    assert {r["setting"] for r in K.ran(one)} == set(C.SETTINGS)

@pytest.mark.parametrize("world", ["three_res", "hybrid_res"])
def test_plan_predicts_packed_bytes_and_peak(world, request):
    # measured at the collectives and by torch's MemTracker; predicted from the plan of the unwrapped model (FSDP1's
    # flat layout, FSDP2's dim-0 padding) — within 5 % at 3 ranks and in the 2-rank shard groups of 2 x 2 hybrid
    for res in request.getfixturevalue(world):
        for p in res["profiles"]:
            assert abs(p["bytes"] / p["predicted_bytes"] - 1) <= 0.05, p
            # the peak is printed as a bound (measure.predict: it allows for buffers gloo's worker thread frees late,
            # which most runs do not see): never exceeded, and never more than twice the measurement (+ 4 KiB: r=1
            # keeps these buffers at a few KiB); the bytes above are exact
            assert p["peak"] <= p["predicted_peak"] <= 2 * p["peak"] + 4096, (p["peak"], p["predicted_peak"], p)
            if p["strategy"] == "packed": assert p["collectives"] == 1, p

"""On 2 gloo ranks, gather_lora returns peft's get_peft_model_state_dict of the unwrapped model bit for bit, before and
after a few optimizer steps, in one collective moving the LoRA bytes (plus padding) that the plan predicts; the merged
stream equals peft's merge_and_unload(): for llama, qwen2, qwen3_moe and the Qwen3-Omni thinker under five policies
(peft's, the guarded one, layer-only, size-only, everything in the root) and FSDP1 (both use_orig_params) / FSDP2, and
for tied embeddings, a named second adapter, modules_to_save and LoRA on a tied head; wrong adapters and missing
tensors are errors that name them."""
import os, sys, time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import gather_cases as C
import gather_checks as K
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.testing.core import covering_array

# Every model, policy and setting, and every pair of them, at least once (not all 60 triples): a covering array over
# the two settings that run every policy, where each (model, policy) pair therefore runs; and FSDP1 with
# use_orig_params=False beside each model and each policy, where only peft's policy runs and the others must refuse.
RUNS = ("fsdp1-orig", "fsdp2")
MATRIX = (covering_array(dict(model=C.MODELS, policy=C.POLICIES, setting=RUNS))
          + [dict(model=C.MODELS[i % len(C.MODELS)], policy=k, setting="fsdp1") for i, k in enumerate(C.POLICIES)])

@pytest.fixture(scope="module")
def results():
    t0 = time.perf_counter()
    res = launch(C.run_matrix, MATRIX + C.variant_cases(), True, nprocs=2, quiet=True, timeout=900)
    print(f"{len(MATRIX) + len(C.variant_cases())} cases on 2 ranks in {time.perf_counter() - t0:.1f} s")
    return res

def test_matrix_ran_everywhere(results):
    rows = K.rows_of(results)
    assert len(rows) == 2 * (len(MATRIX) + len(C.variant_cases()))
    K.assert_no_errors(rows)
    K.assert_refusals_are_fsdp1_mixed_grad(rows)
    ran = K.ran(rows)
    pairs = lambda a, b, rs: {(r[a], r[b]) for r in rs}
    assert pairs("model", "policy", ran) == {(m, k) for m in C.MODELS for k in C.POLICIES}     # every pair ran
    assert pairs("model", "setting", rows) == {(m, s) for m in C.MODELS for s in C.SETTINGS}
    assert pairs("policy", "setting", rows) == {(k, s) for k in C.POLICIES for s in C.SETTINGS}
    assert pairs("model", "setting", ran) >= {(m, s) for m in C.MODELS for s in RUNS}
    assert ("peft", "fsdp1") in pairs("policy", "setting", ran)                                # FSDP1 orig=False runs

def test_equal_to_peft(results): K.assert_equal_to_peft(K.rows_of(results))

def test_one_collective_lora_bytes(results): K.assert_one_collective_lora_bytes(K.rows_of(results))

def test_variants_covered(results):
    # every variant ran on FSDP1 use_orig_params=True and FSDP2 (FSDP1 orig=False refuses mixed requires_grad units)
    rows = K.ran(K.rows_of(results))
    for v in C.VARIANTS:
        got = {r["setting"] for r in rows if all(r.get(k) == x for k, x in v.items() if k != "adapter_name")}
        assert {"fsdp1-orig", "fsdp2"} <= got, (v, got)

def test_lora_in_root_unit_is_collected(results):
    # size policies put LoRA tensors in the root unit: they must all come back
    rows = [r for r in K.ran(K.rows_of(results)) if r["policy"] == "root"]
    assert {r["model"] for r in rows} == set(C.MODELS) and {r["setting"] for r in rows} >= set(RUNS)
    assert all(r["values_equal"] and r["merged_equal"] for r in rows)

def test_missing_lora_raises(results):
    for rank in results:
        msg = rank["missing"]
        assert msg.startswith("16 of 16 LoRA tensors were not collected"), msg
        assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in msg

def test_unknown_adapter_names_the_adapters(results):
    for rank in results:
        for msg in rank["bad_adapter"]:
            assert "no adapter 'nosuch'" in msg and "'default', 'second'" in msg, msg

def test_bucket_cap(results):
    for rank in results:
        for s, b in rank["buckets"].items():
            assert b["equal"], s
            assert b["collectives"] > 1, (s, b)   # a 4 KiB cap splits the ~28 KiB of LoRA
            assert b["bytes"] <= 1.05 * b["lora_bytes"] + 4096 * b["collectives"], (s, b)

"""Collected LoRA tensors equal peft's get_peft_model_state_dict of the unwrapped model bit for bit, the bytes all-gathered (counted at the collectives) equal the minimum exactly, and merged weights equal peft's merge_and_unload() — for llama, qwen2, qwen3_moe and the Qwen3-Omni thinker under five policies (peft's, the guarded one, layer-only, size-only, everything in the root) and FSDP1 (both use_orig_params) / FSDP2, on 2 gloo ranks."""
import os, sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import gather_cases as C
from lora_fsdp_kit.launch import launch

@pytest.fixture(scope="module")
def results():
    # one launch for the whole matrix: each 2-rank launch costs seconds of spawn and imports
    ranks = launch(C.run_matrix, nprocs=2, quiet=True, timeout=400)
    return ranks

def _rows(results): return [r for rank in results for r in rank["rows"]]

def test_matrix_ran_everywhere(results):
    rows = _rows(results)
    assert len(rows) == 2 * len(C.MODELS) * len(C.POLICIES) * len(C.SETTINGS)
    errors = [f"{r['model']}/{r['policy']}/{r['setting']}:\n{r['error']}" for r in rows if "error" in r]
    assert not errors, "\n".join(errors)
    # FSDP1 refuses only use_orig_params=False with frozen base and trainable LoRA in one flat parameter
    for r in rows:
        if "refused" in r:
            assert r["setting"] == "fsdp1/orig=False" and r["policy"] in ("guarded", "layer", "size", "root"), r
            assert "uniform `requires_grad`" in r["refused"], r["refused"]
    for m in C.MODELS:
        for k in C.POLICIES:
            ran = {r["setting"] for r in rows if r["model"] == m and r["policy"] == k and "refused" not in r}
            assert {"fsdp1/orig=True", "fsdp2"} <= ran, (m, k, ran)

@pytest.mark.parametrize("check", ["keys_equal", "values_equal", "own_storage", "merged_names_equal", "merged_equal"])
def test_equal_to_peft(results, check):
    bad = [(r["model"], r["policy"], r["setting"]) for r in _rows(results) if "refused" not in r and not r.get(check)]
    assert not bad, f"{check} fails for {bad}"

def test_bytes_gathered_is_the_minimum(results):
    rows = [r for r in _rows(results) if "refused" not in r]
    bad = [(r["model"], r["policy"], r["setting"], r["bytes_gathered"], r["min_bytes"]) for r in rows
           if r["bytes_gathered"] != r["min_bytes"]]
    assert not bad, bad
    # FSDP2 moves exactly the LoRA bytes: no base weight
    assert all(r["bytes_gathered"] == r["lora_bytes"] for r in rows if r["setting"] == "fsdp2")

def test_bytes_gathered_match_the_plan(results):
    # the plan of the unwrapped model (made before wrapping, without the engine) predicts the FSDP1 bytes: the
    # collectives move each LoRA-bearing unit's flat parameter once (padding to the world size is the only slack)
    rows = [r for r in _rows(results) if "refused" not in r and r["planned_bytes"] is not None]
    assert rows
    bad = [(r["model"], r["policy"], r["setting"], r["bytes_gathered"], r["planned_bytes"]) for r in rows
           if not r["planned_bytes"] <= r["bytes_gathered"] <= 1.05 * r["planned_bytes"]]
    assert not bad, bad

def test_rank0_only(results):
    # rank 0 gets the full state dict bit for bit; the other ranks take part in the collectives and get nothing
    bad = [(r["model"], r["policy"], r["setting"]) for r in _rows(results) if "refused" not in r and not r["rank0_only_ok"]]
    assert not bad, bad

def test_lora_in_root_unit_is_collected(results):
    # size policies put LoRA tensors in the root unit (the upstream 4-of-12 case): they must all come back
    rows = [r for r in _rows(results) if r.get("lora_in_root")]
    assert {(r["model"], r["setting"]) for r in rows if r["policy"] == "root"} == \
           {(m, s) for m in C.MODELS for s in ("fsdp1/orig=True", "fsdp2")}
    assert all(r["values_equal"] and r["merged_equal"] for r in rows)

def test_missing_lora_raises(results):
    for rank in results:
        msg = rank["missing"]
        assert msg.startswith("16 of 16 LoRA tensors were not collected"), msg
        assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in msg

"""The README's "Why" rows still hold, on tiny models: verl's per-unit collector (re-implemented in
bench/prior_art_cases.py) finds no unit under its own LoRA policy and gathers the whole model, and returns fewer
tensors than exist with LoRA inside size units; FSDP1 refuses flat size units; peft's state dict of an FSDP1 model
under its own policy has 0 keys and save_pretrained writes a 40-byte file; accelerate's FSDP2 path shards only the
embedding, the tail and the root given peft's policy — while the kit's gather returns every tensor equal to peft's
state dict of the unwrapped model, bit for bit, moving only the LoRA bytes (2 gloo ranks)."""
import os, sys, tempfile

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import prior_art_cases as C   # noqa: E402  (spawned ranks inherit sys.path)
from lora_fsdp_kit.launch import launch   # noqa: E402

@pytest.fixture(scope="module")
def rows():
    return launch(C.small_rows, tempfile.mkdtemp(prefix="lfk_prior_"), nprocs=2, quiet=True, timeout=600)[0]

def _ran(r:dict)->dict:
    assert "error" not in r, r.get("error")
    return r

def _kit_right(r:dict, wanted:int):
    k = r["kit"]
    assert k["tensors"] == wanted and k["equal"], k

def test_leaf_units_fall_back_to_the_whole_model(rows):
    r = _ran(rows["leaf"])
    p = r["prior"]
    assert p["layered"] == 0 and p["fallback"], p               # no unit has a `lora_` name of its own
    assert p["bytes"] >= r["model_bytes"] > 10 * r["lora_bytes"], (p["bytes"], r["model_bytes"], r["lora_bytes"])
    _kit_right(r, r["wanted"])
    assert r["kit"]["bytes"] == r["lora_bytes"] and r["kit"]["calls"] == 1, r["kit"]

def test_size_units(rows):
    r = _ran(rows["size"])
    assert "uniform `requires_grad`" in (r["flat_error"] or ""), r["flat_error"]
    assert r["plan_errors"], "the plan must report FSDP1's refusal before wrapping"
    assert r["prior"]["tensors"] < r["wanted"], r["prior"]      # the collector misses LoRA tensors
    _kit_right(r, r["wanted"])

def test_peft_state_dict_and_save_are_empty(rows):
    r = _ran(rows["peft_policy"])
    assert r["prior"] == dict(keys=0, file_bytes=40, file_tensors=0), r["prior"]
    _kit_right(r, r["wanted"])
    assert r["kit"]["file_tensors"] == r["wanted"] and r["kit"]["file_equal"], r["kit"]

def test_accelerate_fsdp2_drops_peft_s_policy(rows):
    r = _ran(rows["accelerate_fsdp2"])
    names = r["prior"]["names"]
    assert len(names) == 3 and "<root>" in names, names
    assert any(n.endswith("embed_tokens") for n in names) and any(n.endswith("lm_head") for n in names), names
    assert r["asked"] > 3 and r["kit"]["units"] == r["asked"] + 1, r
    _kit_right(r, r["wanted"])

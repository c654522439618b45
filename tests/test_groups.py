"""A tied input embedding and output head sharded as ONE FSDP2 group, `fully_shard([embed_tokens, lm_head])` (what
accelerate's FSDP2 does, spelled `WrapConfig(tie_group=True)` or `groups=(('**.embed_tokens', '**.lm_head'),)`), on 2
gloo ranks: the plan shows the group as one unit, equal to what torch built, with no error; the model trains; and
gather_lora, iter_lora_buckets, iter_lora, save_lora and load_lora equal peft's own on an unwrapped copy holding
torch's full state dict, bit for bit — with LoRA on q/v and the head, and with the head in peft's modules_to_save."""
import os, sys, tempfile

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import group_cases as C
from lora_fsdp_kit.launch import launch

@pytest.fixture(scope="module")
def rows():
    ranks = launch(C.group_cases, tempfile.mkdtemp(prefix="lfk_groups_"), quiet=True, timeout=600)
    return [r for rank in ranks for r in rank]

def test_every_case_ran(rows):
    errors = [f"{r['case']} (rank {r['rank']}):\n{r['error']}" for r in rows if "error" in r]
    assert not errors, "\n".join(errors)
    assert {(r["case"], r["rank"]) for r in rows} == {(c, k) for c in C.CASES for k in (0, 1)}

def test_the_group_is_one_unit_as_planned(rows):
    for r in rows:
        assert r["groups"] == [["base_model.model.model.embed_tokens", "base_model.model.lm_head"]], r["case"]
        assert r["planned_groups"] == r["groups"], r["case"]        # the plan's unit is torch's group
        assert r["planned"] == r["wrapped"], r["case"]              # every unit, with exactly its parameters
        assert r["plan_errors"] == [], (r["case"], r["plan_errors"])  # no tied-param-split: the tie is in one unit

@pytest.mark.parametrize("check", ["ref_keys_ok", "gather_equal", "buckets_equal", "stream_equal", "tree_equal"])
def test_exports_equal_peft_s(rows, check):
    zero = [r for r in rows if r["rank"] == 0]
    assert zero and all(r.get(check) for r in zero), [(r["case"], r.get(check)) for r in zero]
    assert all(r["n_keys"] > 4 for r in zero)

def test_load_restores_the_adapter(rows):
    for r in rows:
        assert r["differs_before"] and r["load_equal"] and r["loaded"] > 0, (r["case"], r["rank"])
        assert r["next"][0] == r["next"][1], (r["case"], r["next"])   # the loaded model takes the same next step

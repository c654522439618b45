"""The kit inside a real `transformers.Trainer` (accelerate 1.16's FSDP path, put on 2 gloo CPU ranks as on GPUs by
`trainer_runs.fsdp_on_cpu`): with `LoraCheckpointCallback`, 6 steps straight and 3 + resume + 3 end with bitwise-equal
adapters under FSDP1 and FSDP2, where the Trainer's own FSDP1 resume of a peft model does not; the callback leaves the
checkpoint's other files as the Trainer wrote them; and the FSDP units the Trainer built equal, name for name, the
units the kit plans from the run's own files (`Job.from_files` of its config.json, `TrainingArguments.to_json_string()`
and adapter_config.json: `trainer_runs.trainer_files`), no wrapping spelt by hand. One launch for all of it."""
import shutil, tempfile

import pytest

from lora_fsdp_kit.testing import trainer_runs as TR
from lora_fsdp_kit.launch import launch

CASES = [(fl, name) for fl in ("fsdp1", "fsdp2") for name in TR.UNIT_CASES]
# accelerate's FSDP2 shards the input embedding and the head beside the layers, a tied pair in ONE
# `fully_shard([embed_tokens, lm_head])` group: the job read from the Trainer's arguments says so (`wrap_embedding`,
# `wrap_lm_head`, `tie_group`; as two units the plan would call it ✖ tied-param-split, and wrongly)

@pytest.fixture(scope="module")
def suite():
    root = tempfile.mkdtemp(prefix="lfk_trainer_")
    try: yield launch(TR.trainer_suite, root, CASES, quiet=True, timeout=600)[0]
    finally: shutil.rmtree(root, ignore_errors=True)

@pytest.mark.parametrize("flavour", ["fsdp1", "fsdp2"])
def test_resume_with_the_callback_is_exact(suite, flavour):
    a = suite["resume"][flavour]["adapters"]
    assert a["resumed+callback"] == a["straight"]
    assert a["straight+callback"] == a["straight"]      # saving the adapter does not change the training

def test_fsdp1_resume_at_3_ranks_where_one_holds_no_row_of_lora_a():
    # r=4 rows over 3 ranks are chunked 2, 2, 0: rank 2's optimizer state of lora_A is a ShardedTensor with no local
    # shard, which torch's default load planner drops (its keys then differ from the checkpoint's: it raised
    # "Missing key in checkpoint state_dict: optimizer.param_groups"); every multi-node job with r < world meets it
    root = tempfile.mkdtemp(prefix="lfk_trainer3_")
    try: got = launch(TR.resume_runs, root, ("fsdp1",), r=4, plain=False, nprocs=3, quiet=True, timeout=600)[0]
    finally: shutil.rmtree(root, ignore_errors=True)
    a = got["fsdp1"]["adapters"]
    assert a["resumed+callback"] == a["straight+callback"]

def test_the_trainers_own_fsdp1_resume_of_a_peft_model_diverges(suite):
    a = suite["resume"]["fsdp1"]["adapters"]
    assert a["resumed"] != a["straight"]                 # 0-byte model shards, the optimizer state not read back
    assert suite["resume"]["fsdp2"]["adapters"]["resumed"] == suite["resume"]["fsdp2"]["adapters"]["straight"]

@pytest.mark.parametrize("flavour", ["fsdp1", "fsdp2"])
def test_the_checkpoints_other_files_are_unchanged(suite, flavour):
    plain, cb = suite["resume"][flavour]["files"]["plain"], suite["resume"][flavour]["files"]["callback"]
    assert sorted(set(cb) - set(plain)) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    assert {k: cb[k] for k in plain} == plain            # DCP .metadata compared without its per-save random ids
    assert any(k.endswith(".distcp") for k in plain)

@pytest.mark.parametrize("case", CASES, ids="-".join)
def test_the_plan_equals_what_the_trainer_built(suite, case):
    got = next(r for r in suite["units"] if (r["flavour"], r["case"]) == case)
    assert got["loss"] > 0                               # the job trains
    assert got["built"] == got["planned"]
    assert got["plan_errors"] == []                      # and the plan calls it no error

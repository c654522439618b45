"""`fits` answers for one `Job`, read from the trainer's own files: FSDP1 bf16 with LoRA leaves as units (the policy the
Trainer installs for a peft model, `bf16=True`) trains under the Trainer's autocast, and `fits.predict_job` predicts it
within 0.1 % of real gloo ranks (`lora_fsdp_kit.fits.steppeak`, the same autocast around its forward), where bare FSDP1
without autocast is still refused (its first forward fails); accelerate's FSDP1 activation checkpointing, which
checkpoints every unit its policy makes (`WrapConfig.checkpoint_targets='units'`, read from its YAML), is predicted too.
Measured (2026-12, 2 ranks, tiny Mistral, 2 x 64 tokens): the Trainer's FSDP1 bf16 peft units under autocast
1,205,144 B per rank, predicted -0.0013 % (before, `fits` refused it: `mixed-precision-lora-leaf`); accelerate's
checkpointing of every unit 1,392,824 / 1,364,120 B, predicted -0.0011 %."""
import dataclasses, json
from pathlib import Path

import pytest

from lora_fsdp_kit.fits.core import FitsError, predict_job
from lora_fsdp_kit.plan.job import Job
from real_steps import assert_exact, measure_while_predicting

BATCH, SEQ, WORLD = 2, 64, 2
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=256, hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
# the Trainer's arguments (TrainingArguments.to_json_string(), the keys the kit reads) and peft's adapter_config.json
ARGS = dict(per_device_train_batch_size=BATCH, gradient_accumulation_steps=1, bf16=True, fp16=False,
            optim="adamw_torch", max_grad_norm=0.0, gradient_checkpointing=False, fsdp=True, fsdp_config=dict(version=1, min_num_params=0))
# accelerate's FSDP1 with its activation checkpointing: it wraps what the auto-wrap policy wraps (every unit)
ACCELERATE_AC = """distributed_type: FSDP
num_processes: 2
fsdp_config:
  fsdp_version: 1
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_use_orig_params: true
  fsdp_activation_checkpointing: true
"""
ADAPTER = dict(peft_type="LORA", r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)

def files(tmp:Path)->list[str]:
    (tmp/"args.json").write_text(json.dumps(ARGS)); (tmp/"adapter_config.json").write_text(json.dumps(ADAPTER))
    (tmp/"config.json").write_text(json.dumps(MISTRAL))
    return [str(tmp/"config.json"), str(tmp/"args.json"), str(tmp/"adapter_config.json")]

@pytest.fixture(scope="module")
def job(tmp_path_factory)->Job:
    return Job.from_files(*files(tmp_path_factory.mktemp("job")), world=WORLD, seq=SEQ)

@pytest.fixture(scope="module")
def units_job(tmp_path_factory)->Job:
    d = tmp_path_factory.mktemp("units"); (d/"a.yaml").write_text(ACCELERATE_AC)
    (d/"adapter_config.json").write_text(json.dumps(ADAPTER))
    return Job.from_files(d/"a.yaml", d/"adapter_config.json", model=MISTRAL, batch=BATCH, seq=SEQ, use_cache=False)

def spec(job:Job, **kw)->dict:
    "The job as `steppeak` measures it (its own code for the step)."
    return dict(dict(config=MISTRAL, wrap=job.wrap.to_dict(), batch=BATCH, seq=SEQ, r=job.lora_r,
                     targets=list(job.lora_targets), autocast=job.autocast_dtype, use_cache=job.use_cache), **kw)

@pytest.fixture(scope="module")
def real(job, units_job):
    """Per rank: the peak of the Trainer's step (autocast bf16), the errors of the bare step (the kit's own FSDP1 wrap
    runs no autocast), the peaks of accelerate's FSDP1 checkpointing of every unit; one launch, traced meanwhile."""
    box = {}
    def predict(i):
        if i != 1: box[i] = predict_job(job if i == 0 else units_job, backend="gloo")
    got, failed, units = measure_while_predicting([spec(job), spec(job, autocast=None), spec(units_job)], [WORLD] * 3,
                                                  WORLD, predict)
    pred = lambda i, j: box.get(i) or predict_job(j, backend="gloo")
    return got, pred(0, job), failed, units, pred(2, units_job)

def test_the_trainers_fsdp1_bf16_leaves_train_and_are_predicted(job, real):
    assert job.wrap.policy == "peft" and job.wrap.mixed_precision == "bf16" and job.autocast_dtype == "bf16"
    got, pred = real[:2]
    assert_exact("trainer", got, pred)   # the step trains (an error would be its traceback), to the prediction
    assert "the forward under torch.autocast(bf16)" in pred.forward

def test_bare_fsdp1_without_autocast_is_still_refused(job, real):
    assert all("expected m1 and m2 to have the same dtype" in str(e) for e in real[2]), real[2]   # it fails for real
    with pytest.raises(FitsError, match=r"mixed-precision-lora-leaf"):
        predict_job(dataclasses.replace(job, autocast=False), backend="gloo")

def test_accelerates_fsdp1_checkpointing_of_every_unit_is_predicted(units_job, real):
    "accelerate checkpoints what its auto-wrap policy wraps (under peft's policy the LoRA leaves too), not the layers."
    assert units_job.wrap.checkpoint_targets == "units" and units_job.wrap.activation_checkpointing == "wrapper"
    src = units_job.sources["checkpoint_targets"]
    assert src.endswith("fsdp_config.fsdp_activation_checkpointing (FSDP1: every unit)"), src
    got, pred = real[3], real[4]
    assert_exact("units", got, pred)
    assert pred.forward.startswith("checkpoint_wrapper on every unit the auto-wrap policy makes")

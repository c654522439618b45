"""A job read from the trainer's own files (accelerate YAML, the Trainer's arguments JSON, peft's adapter_config.json,
verl's YAML) is the same `Job`, and plans the same units, as the flags that say the same; a config.json typo is refused
by the command line (exit 2) unless --lenient."""
import itertools
import json
from pathlib import Path

from lora_fsdp_kit.__main__ import main
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.plan.job import Job

ACCELERATE = """distributed_type: FSDP
mixed_precision: bf16
num_processes: 2
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
  fsdp_transformer_layer_cls_to_wrap: LlamaDecoderLayer
  fsdp_reshard_after_forward: false
  fsdp_activation_checkpointing: false
"""
VERL = """actor_rollout_ref:
  model: {lora_rank: 4, lora_alpha: 8, target_modules: [q_proj, v_proj], enable_gradient_checkpointing: false}
  actor:
    strategy: fsdp
    ppo_micro_batch_size_per_gpu: 2
    fsdp_config: {param_offload: true, wrap_policy: {min_num_params: 0}}
data: {max_prompt_length: 256, max_response_length: 768}
trainer: {nnodes: 1, n_gpus_per_node: 4}
"""

def test_accelerate_yaml_is_its_flags(tmp_path:Path):
    (tmp_path/"a.yaml").write_text(ACCELERATE)
    job = Job.from_files(tmp_path/"a.yaml", model="llama")
    # accelerate's FSDP2 (fsdp2_prepare_model) also shards the input embedding and the head, a tied pair as one group
    flags = Job.of(model="llama", flavour="fsdp2", policy="layer", layer_cls="LlamaDecoderLayer", world=2,
                   reshard_after_forward=False, mixed_precision="bf16", reduce_dtype="bf16", autocast=True,
                   wrap_embedding=True, wrap_lm_head=True, tie_group=True)   # accelerate reduces in bf16 too
    assert job == flags, (job.line(), flags.line())
    assert [u.name for u in job.plan().units] == [u.name for u in flags.plan().units]
    assert [u.claimed_by for u in job.plan().units] == ["embedding", "layer", "layer", "head", "root"]
    assert job.sources["reshard_after_forward"].endswith("fsdp_config.fsdp_reshard_after_forward")

def test_trainer_json_and_peft_are_their_flags(tmp_path:Path):
    args = dict(per_device_train_batch_size=2, gradient_accumulation_steps=4, bf16=True, fp16=False, optim="adamw_torch_fused",
                max_grad_norm=1.0, gradient_checkpointing=False, fsdp=True, fsdp_config=dict(version=1, min_num_params=0))
    (tmp_path/"args.json").write_text(json.dumps(args))
    (tmp_path/"adapter_config.json").write_text(json.dumps(dict(peft_type="LORA", r=4, lora_alpha=8, use_dora=False,
                                                               target_modules=["q_proj", "v_proj"], lora_dropout=0.05)))
    job = Job.from_files(tmp_path/"args.json", tmp_path/"adapter_config.json", model="llama", world=2)
    flags = Job.of(model="llama", world=2, flavour="fsdp1", policy="peft", use_orig_params=True, mixed_precision="bf16",
                   reduce_dtype="bf16", autocast=True, batch=2, grad_accum=4, optimizer="adamw_torch_fused", max_grad_norm=1.0,
                   backward_prefetch="NO_PREFETCH", lora_r=4, lora_alpha=8, lora_targets="q_proj,v_proj", lora_dropout=0.05)
    assert job == flags, (job.line(), flags.line())
    assert [u.name for u in job.plan().units] == [u.name for u in flags.plan().units]
    assert job.sources["world"] == "given" and job.sources["lora_r"].endswith("adapter_config.json: r")

def test_verl_yaml_is_its_flags(tmp_path:Path):
    (tmp_path/"verl.yaml").write_text(VERL)
    job = Job.from_files(tmp_path/"verl.yaml", model="llama")
    flags = Job.of(model="llama", flavour="fsdp1", policy="lora", use_orig_params=False, world=4, param_dtype="fp32",
                   mixed_precision="bf16", autocast=True, lora_r=4, lora_alpha=8, lora_targets="q_proj,v_proj", batch=2,
                   seq=1024, cpu_offload=True)
    assert job == flags, (job.line(), flags.line())

def test_a_flag_beside_a_file_wins(tmp_path:Path, capsys):
    (tmp_path/"a.yaml").write_text(ACCELERATE)
    assert main(["plan", "--model", "llama", "--job", str(tmp_path/"a.yaml"), "--world", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()   # the job line, folded at 100 columns: its indented rest follows
    first = " ".join([lines[0]] + [l.strip() for l in itertools.takewhile(lambda l: l.startswith(" "), lines[1:])])
    assert first.startswith("job: llama · fsdp2:layer") and "world 4" in first, first

def test_config_typo_is_refused_unless_lenient(tmp_path:Path, capsys):
    d = shipped_config("llama"); d["num_key_value_head"] = d.pop("num_key_value_heads")
    (tmp_path/"config.json").write_text(json.dumps(d))
    assert main(["plan", "--config", str(tmp_path/"config.json")]) == 2
    assert "num_key_value_head: did you mean num_key_value_heads?" in capsys.readouterr().err
    assert main(["plan", "--config", str(tmp_path/"config.json"), "--lenient"]) == 0
    assert "accepted: --lenient" in capsys.readouterr().err

def test_one_meaning_per_flavour(capsys):
    for flavour in ("fsdp1", "fsdp2"):
        assert main(["plan", "--model", "llama", "--flavour", flavour]) == 0
        assert f"{flavour}:layer" in capsys.readouterr().out.splitlines()[0]

FITS_ARGS = dict(per_device_train_batch_size=2, gradient_accumulation_steps=2, bf16=True, fp16=False,
                 optim="adamw_torch", max_grad_norm=0.0, gradient_checkpointing=True, fsdp=True, fsdp_config=dict(version=2))

def _fits(capsys, *argv)->tuple[int, str]:
    rc = main(["fits", "--device-memory", "4GiB", "--reserve", "0B", "--backend", "gloo", "--seq", "32", *argv])
    return rc, capsys.readouterr().out

def test_fits_from_the_files_is_the_fits_of_the_flags(tmp_path:Path, capsys):
    "accelerate's YAML, the Trainer's arguments and peft's adapter_config.json: the answer of the same flags."
    (tmp_path/"a.yaml").write_text(ACCELERATE.replace("reshard_after_forward: false", "reshard_after_forward: true"))
    (tmp_path/"args.json").write_text(json.dumps(FITS_ARGS))
    (tmp_path/"adapter_config.json").write_text(json.dumps(dict(peft_type="LORA", r=4, lora_alpha=8,
                                                               target_modules=["q_proj", "v_proj"])))
    rc, files = _fits(capsys, "--model", "llama", *(w for f in ("a.yaml", "args.json", "adapter_config.json")
                                                    for w in ("--job", str(tmp_path/f))))
    # the Trainer's file comes after accelerate's: under FSDP2 both mean accelerate's fsdp2_prepare_model (layers, the
    # input embedding and the head carved beside them)
    rc2, flags = _fits(capsys, "--model", "llama", "--world", "2", "--flavour", "fsdp2", "--policy", "layer",
                       "--wrap-embedding", "--wrap-lm-head", "--tie-group", "--layer-cls", "LlamaDecoderLayer", "--mixed-precision", "bf16",
                       "--reduce-dtype", "bf16", "--autocast",
                       "--activation-checkpointing", "hf", "--batch", "2", "--grad-accum", "2", "--lora-r", "4",
                       "--lora-targets", "q_proj,v_proj")
    assert rc == rc2 == 0, (files, flags)
    flat = lambda out: " ".join(out.split())   # the lines folded at 100 columns, unfolded
    answer = lambda out: flat(out)[flat(out).index("precision: "):]   # the precision, the forward, the rows
    assert answer(files) == answer(flags), (files, flags)
    assert "under torch.autocast(bf16); 2 micro-batches per optimizer step" in flat(files)
    assert "forward: transformers' gradient checkpointing" in flat(files)
    assert "job: llama · fsdp2:layer layers=LlamaDecoderLayer mixed_precision=bf16 reduce=bf16 head ac=hf tie_group " \
           "embedding " \
           "· LoRA" in flat(files), files
    assert "accum 2" in files
    assert "from a.yaml: world" in flat(files), files
    assert "adapter_config.json: lora_r, lora_alpha, lora_targets" in flat(files), files

def test_fits_flag_beside_a_file_wins(tmp_path:Path, capsys):
    (tmp_path/"a.yaml").write_text(ACCELERATE)
    rc, out = _fits(capsys, "--model", "llama", "--job", str(tmp_path/"a.yaml"), "--world", "4",
                    "--activation-checkpointing", "off,hf")
    assert rc == 0, out
    text = " ".join(out.split())
    given = text[text.index("given beside them: "):].split(" every setting")[0]
    assert "· world 4 ·" in text and all(k in given for k in ("model", "world", "activation_checkpointing")), out
    assert "the wrapping of each row" in text, out
    # the legend says each setting in words, flavour first (issue 50: no "1 = ;" for the shared words alone)
    assert "settings: 1 = FSDP2 on layer units 2 = FSDP2 on layer units, transformers' gradient checkpointing" in text, out

ALL_SEVEN = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"

def test_all_linear_is_peft_s(tmp_path:Path, capsys):
    "peft's target_modules 'all-linear' (adapter_config.json, verl's default, --lora-targets): every linear layer but "
    "the head, as peft adapts them; fits answers what the seven names answer (it used to plan q/k/v/o: -23 % on 8B)."
    (tmp_path/"adapter_config.json").write_text(json.dumps(dict(peft_type="LORA", r=4, target_modules="all-linear")))
    assert main(["plan", "--model", "llama", "--lora-targets", "all-linear"]) == 0
    assert "LoRA 28 tensors" in " ".join(capsys.readouterr().out.split())   # 7 projections x 2 layers x A, B
    (tmp_path/"seven.json").write_text(json.dumps(dict(peft_type="LORA", r=4, target_modules=ALL_SEVEN.split(","))))
    rc, files = _fits(capsys, "--model", "llama", "--world", "2", "--job", str(tmp_path/"adapter_config.json"))
    rc2, names = _fits(capsys, "--model", "llama", "--world", "2", "--job", str(tmp_path/"seven.json"))
    assert rc == rc2 == 0, (files, names)
    flat = lambda out: " ".join(out.split())
    answer = lambda out: flat(out)[flat(out).index("precision: "):]
    assert answer(files) == answer(names), (files, names)
    assert "note:" not in files and "LoRA r=4 alpha=8 on all-linear ·" in flat(files), files

def test_a_flavour_flag_over_a_file_takes_its_fields_off(tmp_path:Path, capsys):
    "--flavour fsdp1 over a file read as FSDP2 (accelerate's carve-out): the file's FSDP2 fields yield, with a note."
    (tmp_path/"a.yaml").write_text(ACCELERATE)
    assert main(["plan", "--model", "llama", "--job", str(tmp_path/"a.yaml"), "--flavour", "fsdp1",
                 "--policy", "peft"]) == 0, capsys.readouterr()
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith("job: llama · fsdp1:peft") and "tie_group=True" in out, out
    assert "fsdp2's, left out under flavour 'fsdp1' (given)" in out, out

def test_hybrid_shard_group_is_the_file_s(tmp_path:Path):
    "accelerate FSDP1 HYBRID_SHARD over 2 nodes x 8: shard groups of 8 (torch's intra-node group), not 2; FSDP2's "
    "parallelism_config (dp_replicate x dp_shard) is hybrid sharding too: each job's units are sharded over 8."
    (tmp_path/"h1.yaml").write_text("distributed_type: FSDP\nnum_machines: 2\nnum_processes: 16\nfsdp_config:\n"
                                    "  fsdp_sharding_strategy: HYBRID_SHARD\n  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP\n")
    (tmp_path/"h2.yaml").write_text("distributed_type: FSDP\nnum_processes: 16\nfsdp_config: {fsdp_version: 2}\n"
                                    "parallelism_config: {parallelism_config_dp_replicate_size: 2, "
                                    "parallelism_config_dp_shard_size: 8}\n")
    for f in ("h1.yaml", "h2.yaml"):
        job = Job.from_files(tmp_path/f, model="llama")
        assert (job.world, job.wrap.shard_size) == (16, 8), (f, job.line())
        assert job.plan().shard_group == 8, f

"""Rank-side cases beyond the gather matrix, each against peft (or torch) on the unwrapped model, at any world size:
a tied head with LoRA streamed (`iter_lora`, `iter_lora_buckets`) and loaded back (`load_lora`); a tied weight with
LoRA on both its names, trainable tokens and FSDP's bf16 mixed precision merged (`iter_merged_weights`); and the
adapter config of a model that FSDP1 wraps whole (`save_lora`); and a save where one rank names an adapter the
model lacks, and one where the ranks' models hold different adapters. Each was wrong before it was a case here."""
from __future__ import annotations

import copy, json, traceback
from pathlib import Path

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model

from lora_fsdp_kit.export import core as E
from lora_fsdp_kit.gather.core import gather_lora, unwrapped_name
from lora_fsdp_kit.gather.merged import iter_merged_weights
from lora_fsdp_kit.models import model_from_config, tiny_model
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.testing.core import case_model, case_wrap, training_batch
from lora_fsdp_kit.plan.wrap import WrapConfig

SETTINGS = ("fsdp1-orig", "fsdp2")
# a Mistral (no shipped config: beyond the zoo) whose decoder model the guarded policy wraps as a unit of its own
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256,
               max_position_embeddings=128)

def _equal(a:dict, b:dict)->bool: return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in b)
def _same(a:dict, b:dict)->bool: return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in b)

def _merged_ref(pm)->dict:
    return {n: p.detach().clone() for n, p in copy.deepcopy(pm).merge_and_unload().named_parameters(remove_duplicate=False)}

def tied_stream_and_load(folder:Path, setting:str)->dict:
    "LoRA on a tied head: the streams equal `gather_lora`; `save_lora` then `load_lora` into a fresh wrap restores it."
    fm = case_wrap(case_model("llama", tied=True, head_lora=True), "layer", setting)
    ref = gather_lora(fm)
    out = dict(tied_in_state=any(".base_layer." in k for k in ref),   # peft's state dict holds the tied base weight
               iter_lora=_same(dict(E.iter_lora(fm)), ref),
               buckets=_same({k: t for b in E.iter_lora_buckets(fm, bucket_bytes=4096) for k, t in b}, ref))
    E.save_lora(fm, folder/"tied")
    fresh = case_wrap(case_model("llama", tied=True, head_lora=True, r=8), "layer", setting)
    with torch.no_grad():
        for p in fresh.parameters():
            if p.requires_grad: p.zero_()   # the adapter comes from the file alone
    E.load_lora(fresh, folder/"tied")
    out["loaded"] = _same(gather_lora(fresh), ref)
    return out

def tied_both_merged(setting:str)->dict:
    "A tied weight with LoRA on the embedding and the head: peft's merge adds both deltas to the one tensor."
    cfg = dict(shipped_config("llama"), tie_word_embeddings=True)
    torch.manual_seed(1)
    pm = get_peft_model(model_from_config(cfg, device="cpu", seed=0),
                        LoraConfig(r=4, lora_alpha=8, target_modules=["embed_tokens", "lm_head"]))
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n or "lora_embedding_B" in n: p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    ref = _merged_ref(pm)
    fm = case_wrap(pm, "layer", setting)
    training_batch(fm, 0)   # the vocabulary is read through peft's LoRA embedding
    return dict(merged=_same(dict(iter_merged_weights(fm)), ref))

def trainable_tokens_merged(setting:str)->dict:
    "`trainable_token_indices` beside LoRA: the merged embedding holds the trained rows, as peft's merge writes them."
    torch.manual_seed(0)
    pm = get_peft_model(tiny_model("llama"), LoraConfig(r=4, target_modules=["q_proj"], trainable_token_indices=[1, 5, 9]))
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n or "trainable_tokens_delta" in n: p.add_(0.1)
    ref = _merged_ref(pm)
    return dict(merged=_same(dict(iter_merged_weights(case_wrap(pm, "layer", setting))), ref))

def mixed_precision_merged(setting:str)->dict:
    "bf16 compute, fp32 masters: the merged weights are the masters' (torch's own full tensors / full params)."
    pm = get_peft_model(model_from_config(MISTRAL, device="cpu", seed=0),
                        LoraConfig(r=7, lora_alpha=6, target_modules=["q_proj", "v_proj"]))
    copy_ = copy.deepcopy(pm)
    fm = (WrapConfig(flavour="fsdp2", policy="layer", mixed_precision="bf16") if setting == "fsdp2" else
          WrapConfig(flavour="fsdp1", policy="layer", use_orig_params=True, mixed_precision="bf16")).wrap(pm)
    loss = fm(input_ids=(ids := training_batch(fm, 0)), labels=ids).loss   # a step: FSDP2 then holds compute copies
    loss.backward()
    torch.optim.AdamW([p for p in fm.parameters() if p.requires_grad], lr=1e-2).step()
    own = dict(copy_.named_parameters())
    with torch.no_grad():
        if setting == "fsdp2":
            for n, p in pm.named_parameters(): own[n].copy_(p.full_tensor())
        else:
            from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
            with FSDP.summon_full_params(fm, writeback=False):
                for n, p in fm.named_parameters(): own[unwrapped_name(n)].copy_(p)
    got = dict(iter_merged_weights(fm))
    return dict(merged=_same(got, _merged_ref(copy_)), dtypes=sorted({str(t.dtype) for t in got.values()}))

def automap_of_wrapped_model(folder:Path)->dict:
    "No task_type: save_lora names the model class peft names (FSDP1 wraps the decoder model itself here)."
    base = model_from_config(MISTRAL, device="cpu", seed=0)
    pm = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    ref = copy.deepcopy(pm)
    fm = case_wrap(pm, "guarded", "fsdp1-orig")
    wrapped = type(pm.base_model.model).__name__
    E.save_lora(fm, folder/"automap")
    if dist.get_rank() != 0: return {}
    ref.save_pretrained(str(folder/"peft_automap"))
    read = lambda d: json.loads((folder/d/"adapter_config.json").read_text()).get("auto_mapping")
    return dict(wrapped=wrapped, auto_mapping=read("automap"), peft_auto_mapping=read("peft_automap"))

def adapter_name_on_one_rank(folder:Path)->dict:
    "One rank names an adapter the model lacks (a typo there): every rank raises, naming it; none waits for ever."
    fm = case_wrap(case_model("llama"), "layer", "fsdp2")
    name = "typo" if dist.get_rank() == dist.get_world_size() - 1 else "default"
    out = {}
    for what, call in (("save_lora", lambda: E.save_lora(fm, folder/"typo", adapter_name=name)),
                       ("iter_lora", lambda: list(E.iter_lora(fm, adapter_name=name))),
                       ("iter_lora_buckets", lambda: list(E.iter_lora_buckets(fm, bucket_bytes=4096, adapter_name=name))),
                       ("iter_merged_weights", lambda: list(iter_merged_weights(fm, adapter_name=name)))):
        try: call(); out[what] = dict(raised=None)
        except Exception as e: out[what] = dict(raised=type(e).__name__, says="no adapter 'typo'" in str(e))
    return out

def adapter_lists_differ(folder:Path)->dict:
    "Every adapter saved (save_lora's default) where the ranks' models hold other adapters: all raise, none writes."
    fm = case_wrap(case_model("llama"), "layer", "fsdp2")
    # the last rank holds "x" and "y", the others "x,y": joined with commas, both lists read "default,x,y"
    for n in (("x", "y") if dist.get_rank() == dist.get_world_size() - 1 else ("x,y",)):
        E.peft_model_of(fm).add_adapter(n, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    try: E.save_lora(fm, folder/"lists"); return dict(raised=None)
    except Exception as e: return dict(raised=type(e).__name__, written=(folder/"lists").exists(), says=str(e)[:400])

def bucket_size_of_wrapped(setting:str)->dict:
    "rollout.bucket_bytes of the wrapped model: sized by the whole tensors, as on the unwrapped model, on every rank."
    from lora_fsdp_kit.rollout.core import bucket_bytes
    sizes = [p.numel() * p.element_size() for p in case_model("llama").parameters()]
    fm = case_wrap(case_model("llama"), "layer", setting)   # FSDP1's own parameters are each rank's flat shards
    return dict(whole=bucket_bytes(fm, free_bytes=10**12) == sum(sizes),
                largest=bucket_bytes(fm, free_bytes=max(sizes)) == max(sizes))

def bucket_bytes_of_each_rank(setting:str)->dict:
    "Each rank streams with a bucket size of its own (as one sized from its own free memory): the same stream on all."
    fm = case_wrap(case_model("llama"), "layer", setting)
    ref = gather_lora(fm)
    got = [b for b in E.iter_lora_buckets(fm, bucket_bytes=2100 * (1 + 3 * dist.get_rank()))]   # cut otherwise alone
    return dict(same=_same({k: t for b in got for k, t in b}, ref), buckets=len(got))

def run(folder:str)->dict:
    "Every case on every setting; an error is kept as its text, so one case failing shows beside the others."
    folder, out = Path(folder), {}
    cases = [(f"{name} {s}", fn) for s in SETTINGS for name, fn in (
                 ("tied_stream_and_load", lambda s=s: tied_stream_and_load(folder/s, s)),
                 ("tied_both_merged", lambda s=s: tied_both_merged(s)),
                 ("trainable_tokens_merged", lambda s=s: trainable_tokens_merged(s)),
                 ("mixed_precision_merged", lambda s=s: mixed_precision_merged(s)),
                 ("bucket_bytes_of_each_rank", lambda s=s: bucket_bytes_of_each_rank(s)),
                 ("bucket_size_of_wrapped", lambda s=s: bucket_size_of_wrapped(s)))]
    cases.append(("automap_of_wrapped_model", lambda: automap_of_wrapped_model(folder)))
    cases.append(("adapter_name_on_one_rank", lambda: adapter_name_on_one_rank(folder)))
    cases.append(("adapter_lists_differ", lambda: adapter_lists_differ(folder)))
    for name, fn in cases:
        try: out[name] = fn()
        except Exception: out[name] = dict(error=traceback.format_exc()[-3000:])
    return out

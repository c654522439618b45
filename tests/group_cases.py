"""Rank-side cases for tests/test_groups.py: a tied embedding and head sharded as ONE FSDP2 group (`fully_shard([embed,
head])`, accelerate's FSDP2 spelling), trained, then every export of the kit against peft's own on an unwrapped copy."""
from __future__ import annotations

import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from peft import get_peft_model_state_dict

import lora_fsdp_kit.export.core as E
from export_cases import _equal, _tree, loaded_back, torch_full_state
from lora_fsdp_kit.testing.fidelity import planned_units, units_of
from lora_fsdp_kit.gather.core import gather_lora
from lora_fsdp_kit.testing.core import train_steps
from lora_fsdp_kit.testing.trainer_runs import chapter_model
from lora_fsdp_kit.plan.wrap import WrapConfig

LAYER = "LlamaDecoderLayer"
# (model: chapter_model's arguments, the WrapConfig): the tied embedding and head in one group, spelled both ways;
# `tie_group` as `Job.from_files` reads an accelerate FSDP2 config: layers, the embedding and the head, no names given
CASES = {
    "tie_group+lora_head": (dict(tied=True, lora_head=True),
                            dict(policy="layer", wrap_embedding=True, wrap_lm_head=True, tie_group=True)),
    "groups+lora_head": (dict(tied=True, lora_head=True),
                         dict(targets=LAYER, groups=(("**.embed_tokens", "**.lm_head"),))),
    "groups+modules_to_save": (dict(tied=True, modules_to_save=("lm_head",)),
                               dict(targets=LAYER, groups=(("**.embed_tokens", "**.lm_head"),))),
}

def _fsdp_groups(fm)->list[list[str]]:
    "The modules of each FSDP2 parameter group with more than one module (one `fully_shard([...])` call)."
    from torch.distributed.fsdp import FSDPModule
    from lora_fsdp_kit.shards import clean_name
    by = {}
    for n, m in fm.named_modules():
        if isinstance(m, FSDPModule): by.setdefault(id(m._get_fsdp_state()), []).append(clean_name(n))
    return [g for g in by.values() if len(g) > 1]

def _checks(ref, got:dict, buckets:list, stream:list, d:Path)->dict:
    "Rank 0: the gather, both streams and the saved folder against peft's on the unwrapped reference."
    want = {k: v.detach() for k, v in get_peft_model_state_dict(ref).items()}
    flat = dict(kv for b in buckets for kv in b)
    ref.save_pretrained(str(d/"peft"))
    srt = lambda kv: dict(sorted(kv))   # the stream goes one unit at a time: the group's keys come first
    return dict(n_keys=len(want), gather_equal=_equal(got, want), stream_equal=_equal(srt(stream), srt(want.items())),
                buckets_equal=len(buckets) > 1 and _equal(srt(flat.items()), srt(want.items())),
                tree_equal=_tree(d/"adapter") == _tree(d/"peft"))

def group_case(folder:str, name:str)->dict:
    "Rank function: plan, wrap with the group, train 2 steps; gather, stream, save and load against peft."
    kw, wc = CASES[name]
    cfg, rank = WrapConfig(**wc), dist.get_rank()
    d = Path(folder)/name
    res = dict(case=name, rank=rank)
    try:
        plan = cfg.plan(chapter_model(**kw), world_size=dist.get_world_size(), rank=rank)
        res["planned"], res["plan_errors"] = planned_units(plan), [f.check for f in plan.check()
                                                                    if f.severity == "error"]
        res["planned_groups"] = [list(u.members) for u in plan.units if u.members]
        fm = cfg.wrap(chapter_model(**kw))
        res["wrapped"], res["groups"] = units_of(fm), _fsdp_groups(fm)
        res["losses"] = train_steps(fm, 2)
        full = torch_full_state(fm, "fsdp2")
        got = gather_lora(fm, progress=False)
        buckets, stream = list(E.iter_lora_buckets(fm, bucket_bytes=1536)), list(E.iter_lora(fm))
        E.save_lora(fm, d/"adapter")
        if rank == 0:   # rank 0 alone: an error here must not leave the others in the collectives below
            try:
                ref = chapter_model(**kw)
                missing, unexpected = ref.load_state_dict(full, strict=False)
                res["ref_keys_ok"] = not missing and not unexpected
                res.update(_checks(ref, got, buckets, stream, d))
            except Exception: res["error"] = traceback.format_exc()
        res.update(loaded_back(fm, cfg.wrap(chapter_model(**kw)), got, d/"adapter"))
    except Exception:
        res["error"] = traceback.format_exc()
    return res

def group_cases(folder:str, names:tuple=tuple(CASES))->list[dict]:
    "Rank function: `group_case` for each case, in one launch."
    return [group_case(folder, n) for n in names]

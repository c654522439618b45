"""Rank-side cases for tests/test_measure.py: every gather strategy measured beside the plan's prediction."""
from __future__ import annotations

import dataclasses

import torch.distributed as dist

from lora_fsdp_kit.plan import core as P
from lora_fsdp_kit.memory.measure import measure_gather
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.testing.core import case_config

def build(hidden:int, r:int):
    "A tiny llama of `hidden` with LoRA of rank `r` on q/v (uneven dims 0 at 3 ranks)."
    cfg = dict(shipped_config("llama"), hidden_size=hidden, intermediate_size=2 * hidden, head_dim=hidden // 4,
               num_attention_heads=4, num_key_value_heads=2)
    return add_lora(model_from_config(cfg, device="cpu"), r=r, alpha=2 * r, target_modules=("q_proj", "v_proj"))

def predictions(cases:dict[int, list[tuple]])->list[dict]:
    """Rank function, one launch for every shard-group size: {world: [(flavour, policy, strategy, hidden, r)]}, each
    case wrapped on the first `world` ranks (their own process group) and measured with `measure_gather` and the plan;
    the other ranks sit it out."""
    groups = {w: dist.new_group(list(range(w))) for w in sorted(cases)}   # every rank creates every group, in order
    out = []
    for world in sorted(cases):
        if dist.get_rank() >= world: continue
        for flavour, policy, strategy, hidden, r in cases[world]:
            pm = build(hidden, r)
            cfg = case_config(policy, "fsdp1-orig" if (flavour, policy) == ("fsdp1", "layer") else flavour)
            plan = P.plan_fsdp1(pm, cfg.auto_wrap_policy(pm), use_orig_params=cfg.use_orig_params,
                                allow_root_only=True)
            if flavour == "fsdp2": plan = dataclasses.replace(plan, flavour="fsdp2")
            p = measure_gather(cfg.wrap(pm, mesh=groups[world]), strategy, plan=plan)
            out.append(dict(case=(flavour, policy, strategy, hidden, r), world=world, bytes=p.bytes_gathered,
                            predicted_bytes=p.predicted_bytes, peak=p.peak_extra, predicted_peak=p.predicted_peak,
                            units=[(u.name, u.bytes_gathered, u.predicted_bytes) for u in p.units]))
    return out

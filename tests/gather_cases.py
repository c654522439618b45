"""Rank-side cases for the gather tests: the matrices (model x policy x FSDP setting x variant) and the checks that
need a live process group, run in one launch per world size (each launch costs seconds of spawn and imports)."""
from __future__ import annotations

import torch.distributed as dist

from lora_fsdp_kit.gather.core import Fsdp1GatherEngine, MissingLoraError, gather_lora
from lora_fsdp_kit.gather.merged import iter_merged_weights
from lora_fsdp_kit.platform import EngineRegistry
from lora_fsdp_kit.testing.core import case_model, case_wrap, gather_case

MODELS = ("llama", "qwen2", "qwen3_moe", "qwen3_omni_thinker")
POLICIES = ("peft", "guarded", "layer", "size", "root")   # root: a size policy so large that all LoRA stays in the root unit
SETTINGS = ("fsdp1", "fsdp1-orig", "fsdp2")

# the faults of a first-time user: tied embeddings, a second adapter, the head in modules_to_save, LoRA on a tied
# head, NO_SHARD; each on both FSDP1 settings and FSDP2 where FSDP accepts it
VARIANTS = [dict(tied=True), dict(second_adapter=True, adapter_name="second"), dict(modules_to_save=("lm_head",)),
            dict(tied=True, head_lora=True)]

def variant_cases(settings=SETTINGS)->list[dict]:
    """Each variant on each setting: peft's policy for FSDP1 use_orig_params=False (it refuses mixed requires_grad
    units), decoder layers as units otherwise."""
    return [dict(model="llama", setting=s, policy="peft" if s == "fsdp1" else "layer", **v) for v in VARIANTS
            for s in settings]

class PriorArtEngine(Fsdp1GatherEngine):
    """The unit filter of the RL framework this kit was first written for: a unit counts only if its own (local)
    parameter names contain 'lora_' (so LoRA leaf units, whose own parameter is just `weight`, are skipped)."""
    def shards(self, names):
        keep = set()
        for u, ns in self.lora_units(names):
            local = [n[len(u.name) + 1:] if u.name else n for n in u.param_names]
            if any("lora_" in n for n in local): keep |= set(ns)
        return super().shards([n for n in names if n in keep])

def missing_lora_error()->str:
    "Plug that unit filter in through the EngineRegistry; gather_lora must raise, naming what is missing."
    fm = case_wrap(case_model("llama"), "peft", "fsdp1")
    EngineRegistry.register("fsdp1", "cpu")(PriorArtEngine)
    try:
        gather_lora(fm)
        return "no error"
    except MissingLoraError as e:
        return str(e)
    finally:
        EngineRegistry.unregister("fsdp1", "cpu")

def bad_adapter_errors()->list[str]:
    "gather_lora / iter_merged_weights with an adapter the model does not have: the message names the adapters."
    fm = case_wrap(case_model("llama", second_adapter=True), "layer", "fsdp2")
    out = []
    for f in (lambda: gather_lora(fm, adapter_name="nosuch"), lambda: next(iter_merged_weights(fm, adapter_name="nosuch"))):
        try: f(); out.append("no error")
        except ValueError as e: out.append(str(e))
    return out

def bucketed(setting:str="fsdp1-orig")->dict:
    "A byte cap on the packed buffer: one collective per bucket, the same tensors."
    from lora_fsdp_kit.memory.core import AllGatherCounter
    fm = case_wrap(case_model("llama"), "layer", setting)
    whole = gather_lora(fm)
    with AllGatherCounter() as c: got = gather_lora(fm, bucket_bytes=4096)
    import torch
    return dict(equal=list(got) == list(whole) and all(torch.equal(got[k], whole[k]) for k in whole),
                collectives=c.calls, bytes=c.bytes, lora_bytes=sum(t.nbytes for t in whole.values()))

def profiles(sharding:str|None=None)->list[dict]:
    "measure_gather('packed') with the plan of the unwrapped model: measured vs predicted bytes and peak."
    from lora_fsdp_kit.plan import core as P
    from lora_fsdp_kit.memory.measure import measure_gather
    import dataclasses
    out = []
    for setting, policy in (("fsdp1", "peft"), ("fsdp1-orig", "layer"), ("fsdp2", "layer")):
        pm = case_model("llama", r=1)   # r=1: dim-0 padding is the largest share of FSDP2's shards
        from lora_fsdp_kit.testing.core import case_policy
        plan = P.plan_fsdp1(pm, case_policy(pm, policy), use_orig_params=setting == "fsdp1-orig")
        if setting == "fsdp2": plan = dataclasses.replace(plan, flavour="fsdp2")
        fm = case_wrap(pm, policy, setting, "HYBRID" if sharding and setting == "fsdp2" else sharding)
        gather_lora(fm)   # the first gather plans its collective once per model; what is measured is a gather
        for strategy in ("packed",) + (("lora_only",) if setting == "fsdp2" else ()):
            p = measure_gather(fm, strategy, plan=plan)
            out.append(dict(setting=setting, policy=policy, strategy=strategy, bytes=p.bytes_gathered,
                            predicted_bytes=p.predicted_bytes, peak=p.peak_extra, predicted_peak=p.predicted_peak,
                            lora_bytes=p.lora_bytes, collectives=sum(u.collectives for u in p.units)))
    return out

def run_matrix(cases:list[dict], extras:bool=False, profile:str|bool=False)->dict:
    """Every case; with `extras`, the error and bucket checks; with `profile`, measured vs predicted (a sharding name
    or True). Per-case results (no tensors) for the parent."""
    res = dict(rows=[gather_case(**c) for c in cases], rank=dist.get_rank(), world=dist.get_world_size())
    if profile: res["profiles"] = profiles(profile if isinstance(profile, str) else None)
    if extras:
        res.update(missing=missing_lora_error(), bad_adapter=bad_adapter_errors(),
                   buckets={s: bucketed(s) for s in ("fsdp1-orig", "fsdp2")})
    return res

"""Rank-side cases for tests/test_gather.py: every model x policy x FSDP setting in one launch."""
from __future__ import annotations

import copy, time, traceback

import torch
from peft import get_peft_model_state_dict

from lora_fsdp_kit import plan as P
from lora_fsdp_kit.gather import Fsdp1GatherEngine, MissingLoraError, gather_lora, iter_merged_weights
from lora_fsdp_kit.memory import AllGatherCounter
from lora_fsdp_kit.models import add_lora, tiny_model
from lora_fsdp_kit.platform import EngineRegistry

MODELS = ("llama", "qwen2", "qwen3_moe", "qwen3_omni_thinker")
POLICIES = ("peft", "guarded", "layer", "size", "root")   # root: a size policy so large that all LoRA stays in the root unit
SETTINGS = ("fsdp1/orig=False", "fsdp1/orig=True", "fsdp2")
SIZE = 20_000    # min_num_params of the size parts: LoRA lands in the root and in size units

def policy(pm, kind:str):
    if kind == "peft":
        try: return P.peft_wrap_policy(pm)
        except ValueError: return P.peft_wrap_policy(pm, layer_cls="auto")   # Omni: peft names talker classes
    if kind == "guarded": return P.lora_wrap_policy(pm, min_num_params=SIZE)
    if kind == "layer": return P.layer_wrap_policy(pm)
    if kind == "size": return P.size_wrap_policy(SIZE)
    if kind == "root": return P.size_wrap_policy(10**9)
    raise ValueError(kind)

def wrap(pm, kind:str, setting:str):
    pol = policy(pm, kind)
    if setting.startswith("fsdp1"): return P.wrap_fsdp1(pm, pol, use_orig_params=setting.endswith("True"))
    return P.wrap_fsdp2_like(pm, pol)   # FSDP2 on the modules the same policy makes FSDP1 units of

def one(model:str, kind:str, setting:str)->dict:
    t0 = time.perf_counter()
    res = dict(model=model, policy=kind, setting=setting)
    pm = add_lora(tiny_model(model))
    ref = {k: v.detach().clone() for k, v in get_peft_model_state_dict(pm).items()}
    merged_ref = {n: p.detach().clone() for n, p in copy.deepcopy(pm).merge_and_unload().named_parameters()}
    # an independent reference for the bytes: the plan of the unwrapped model (FSDP1: the LoRA-bearing units' flat
    # parameters; FSDP2: the LoRA tensors), made before wrapping
    if setting.startswith("fsdp1"):
        planned = P.plan_fsdp1(pm, policy(pm, kind), use_orig_params=setting.endswith("True"), allow_root_only=True)
    else: planned = None
    try: fm = wrap(pm, kind, setting)
    except Exception as e:
        return dict(res, refused=f"{type(e).__name__}: {e}", seconds=time.perf_counter() - t0)
    try:
        with AllGatherCounter() as c: got = gather_lora(fm)
        from lora_fsdp_kit.gather import gather_engine
        eng = gather_engine(fm)
        if setting.startswith("fsdp1"): minimum = sum(u.gather_bytes for u, _ in eng.lora_units(eng.lora_names()))
        else: minimum = sum(t.numel() * t.element_size() for t in ref.values())
        merged = dict(iter_merged_weights(fm))
        import torch.distributed as dist
        got0 = gather_lora(fm, rank0_only=True)
        rank0_only_ok = (list(got0) == list(ref) and all(torch.equal(got0[k], ref[k]) for k in ref)) if dist.get_rank() == 0 \
                        else got0 == {}
        res.update(n_lora=len(ref), keys_equal=list(got) == list(ref),
                   values_equal=set(got) == set(ref) and all(torch.equal(got[k], ref[k]) for k in ref),
                   own_storage=all(t.untyped_storage().nbytes() == t.numel() * t.element_size() and not t.requires_grad
                                   for t in got.values()),
                   bytes_gathered=c.bytes, min_bytes=minimum, lora_bytes=sum(t.numel() * t.element_size() for t in ref.values()),
                   merged_names_equal=set(merged) == set(merged_ref),
                   merged_equal=set(merged) == set(merged_ref) and all(torch.equal(merged[k], merged_ref[k]) for k in merged_ref),
                   n_units=len(eng.units), lora_in_root=any(u.name == "" for u, _ in eng.lora_units(eng.lora_names())),
                   planned_bytes=planned.gather_total_bytes if planned else None, rank0_only_ok=rank0_only_ok)
    except Exception:
        res["error"] = traceback.format_exc()
    res["seconds"] = time.perf_counter() - t0
    return res

class PriorArtEngine(Fsdp1GatherEngine):
    "The upstream collector's unit filter: a unit is gathered only if its own (local) parameter names contain 'lora_'."
    def lora_units(self, names):
        out = []
        for u, ns in super().lora_units(names):
            local = [n[len(u.name) + 1:] if u.name else n for n in u.param_names]
            if any("lora_" in n for n in local): out.append((u, ns))
        return out

def missing_lora_error()->str:
    "Plug the prior-art unit filter in through the EngineRegistry; gather_lora must raise, naming what is missing."
    pm = add_lora(tiny_model("llama"))
    fm = wrap(pm, "peft", "fsdp1/orig=False")
    EngineRegistry.register("fsdp1", "cpu")(PriorArtEngine)
    try:
        gather_lora(fm)
        return "no error"
    except MissingLoraError as e:
        return str(e)
    finally:
        EngineRegistry.unregister("fsdp1", "cpu")

def run_matrix(models=MODELS, policies=POLICIES, settings=SETTINGS)->dict:
    "Every configuration, then the missing-LoRA case; per-configuration results (no tensors) for the parent to assert on."
    rows = [one(m, k, s) for m in models for k in policies for s in settings]
    return dict(rows=rows, missing=missing_lora_error())

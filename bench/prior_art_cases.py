"""Rank-side cases for bench/prior_art.py and tests/test_prior_art.py: each row of the README's "Why" table, measured
on the prior art (verl's per-unit LoRA collector, peft, accelerate, torchtune) and on the kit, on the same model.

verl and torchtune are not dependencies: the few lines of theirs that each row is about are re-implemented below,
each with a comment naming the file and function reproduced. peft, accelerate, torch and transformers are called
as installed. Every case returns plain measurements (counts, bytes, error texts); the script formats them.
"""
from __future__ import annotations

import functools
from collections import OrderedDict
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist
from peft.utils.save_and_load import get_peft_model_state_dict
from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel as FSDP, fully_shard
from torch.distributed.fsdp.wrap import (_or_policy, lambda_auto_wrap_policy, size_based_auto_wrap_policy,
                                         transformer_auto_wrap_policy)

from lora_fsdp_kit.plan import core as P
from lora_fsdp_kit.plan.policies import layer_wrap_policy
from lora_fsdp_kit.export.core import save_lora
from lora_fsdp_kit.gather.core import gather_lora
from lora_fsdp_kit.memory.core import AllGatherCounter
from lora_fsdp_kit.testing.core import case_model

BIG = dict(layers=24, hidden=256)   # the README's model: a 24-layer llama of hidden size 256 (intermediate 512)
CPU = torch.device("cpu")           # FSDP1 on the CPU needs device_id=cpu (device_id=None fails)

# ---------------------------------------------------------------------------------------------------------------
# verl, re-implemented: the wrap policy and the per-unit LoRA collector, as in verl/utils/fsdp_utils.py
# ---------------------------------------------------------------------------------------------------------------
def _verl_lora_leaf(module)->bool:
    "verl's LoRA lambda: a leaf module with a trainable weight (each lora_A / lora_B Linear)."
    return bool(len(list(module.named_children())) == 0 and getattr(module, "weight", None) is not None
                and module.weight.requires_grad)

def verl_wrap_policy(model, min_num_params:int=0):
    "verl `get_fsdp_wrap_policy(module, config, is_lora=True)`: LoRA leaves only when min_num_params == 0 (its guard)."
    # verl/utils/fsdp_utils.py::get_fsdp_wrap_policy: lambda part if is_lora and min_num_params == 0; then the size
    # part if min_num_params > 0, else a transformer part on the model's `_no_split_modules` classes; OR-ed.
    policies = []
    if min_num_params == 0: policies.append(functools.partial(lambda_auto_wrap_policy, lambda_fn=_verl_lora_leaf))
    if min_num_params > 0:
        policies.append(functools.partial(size_based_auto_wrap_policy, min_num_params=min_num_params))
    else:
        names = set(getattr(model, "_no_split_modules", None) or [])
        classes = {type(m) for m in model.modules() if type(m).__name__ in names}
        policies.append(functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=classes))
    return functools.partial(_or_policy, policies=policies)

def _fsdp_version(m)->int: return 1 if isinstance(m, FSDP) else 2 if isinstance(m, FSDPModule) else 0

def _full_cpu(p):
    "verl's `.detach().cpu()` of a gathered tensor, as a copy (on the CPU `.cpu()` would return FSDP's own storage)."
    # on a GPU `.cpu()` copies; on the CPU it returns a view of the unsharded storage FSDP frees when the summon ends
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().cpu().clone()

def verl_layered_summon(fsdp_module)->OrderedDict:
    "verl `layered_summon_lora_params`: visit each FSDP unit, skip those whose own parameter names hold no `lora_`."
    # verl/utils/fsdp_utils.py::layered_summon_lora_params (HEAD of 2026-08), its unit filter and summon, kept:
    # skip the root and non-FSDP modules and names ending in .model/.layers; a unit counts only if one of its own
    # parameter names (nested units' excluded) contains "lora_"; FSDP1: set `_is_root`, summon_full_params (which
    # recurses into nested units by default), peft's get_peft_model_state_dict on the unit's own parameters; the
    # flag is reset only when something came back (as there).
    peft_model = getattr(fsdp_module, "_fsdp_wrapped_module", fsdp_module)
    out = OrderedDict()
    for name, sub in fsdp_module.named_modules():
        if name == "" or _fsdp_version(sub) == 0: continue
        prefix = name.replace("_fsdp_wrapped_module.", "")
        if prefix.endswith(".model") or prefix.endswith(".layers"): continue
        v1 = _fsdp_version(sub) == 1
        nested = {n for n, m in sub.named_modules() if n != "" and _fsdp_version(m) > 0}
        own = lambda: {n: p for n, p in sub.named_parameters() if not any(n.startswith(f"{x}.") for x in nested)}
        if not any("lora_" in n for n in own()): continue
        if v1: sub._is_root = True
        with FSDP.summon_full_params(sub, writeback=False) if v1 else nullcontext():
            got = get_peft_model_state_dict(peft_model, state_dict=own())
            if not got: continue
            out.update({f"{prefix}.{k}": _full_cpu(p) for k, p in got.items()})
            if v1: sub._is_root = False
    return out

def verl_collect_lora_params(module)->dict:
    "verl `collect_lora_params(module, layered_summon=True, base_sync_done=True)`: layered, else a full summon."
    # verl/utils/fsdp_utils.py::collect_lora_params: when the layered path returns nothing, it logs a warning and
    # summons the whole model (FSDP1: summon_full_params(offload_to_cpu=True)) for peft's state dict of it. Here
    # offload_to_cpu=False: on a CPU-only torch 2.13 the offloaded summon raises (use_orig_params=False: "setStorage
    # ... out of bounds") or kills the rank (use_orig_params=True), while on a GPU it gathers the same bytes; the
    # all-gathers counted here do not depend on where the gathered copy goes afterwards.
    res = dict(layered=0, fallback=False, tensors={}, error=None)
    try:
        got = verl_layered_summon(module)
        res["layered"] = len(got)
        if not got:
            res["fallback"] = True
            peft_model = getattr(module, "_fsdp_wrapped_module", module)
            v1 = _fsdp_version(module) == 1
            with FSDP.summon_full_params(module, writeback=False, offload_to_cpu=False) if v1 else nullcontext():
                got = {k: _full_cpu(p) for k, p in get_peft_model_state_dict(peft_model).items()}
        res["tensors"] = got
    except Exception as e: res["error"] = f"{type(e).__name__}: {e}".splitlines()[0][:160]
    return res

# ---------------------------------------------------------------------------------------------------------------
# torchtune, re-implemented: its FSDP2 adapter gather
# ---------------------------------------------------------------------------------------------------------------
def torchtune_gather_adapter(model)->dict:
    "torchtune `gather_cpu_state_dict(model, is_rank_zero, adapter_weights_only=True)`: full_tensor(), then filter."
    # torchtune/training/_distributed.py::gather_cpu_state_dict: for every entry of model.state_dict(), a DTensor is
    # gathered with .full_tensor() (base weights included) and kept on rank 0; with adapter_weights_only the result
    # is filtered afterwards by get_adapter_state_dict (keys containing "lora" or "magnitude").
    rank0, out = dist.get_rank() == 0, {}
    for name, p in model.state_dict().items():
        if hasattr(p, "_local_tensor"): p = p.full_tensor()
        if rank0: out[name] = p.cpu()
        dist.barrier()
    return {k: v for k, v in out.items() if "lora" in k or "magnitude" in k}

# ---------------------------------------------------------------------------------------------------------------
# shared steps
# ---------------------------------------------------------------------------------------------------------------
def _warm(fm):
    "One forward and backward pass (no step), as training runs before a collector: units set up, then resharded."
    x = torch.arange(8).reshape(2, 4)
    fm(input_ids=x, labels=x).loss.backward()
    fm.zero_grad(set_to_none=True)
    return fm

def _fsdp1(pm, policy, orig:bool):
    return _warm(FSDP(pm, auto_wrap_policy=policy, device_id=CPU, use_orig_params=orig))

def _fsdp2(pm, modules):
    "fully_shard each of `modules` (children first), then the root."
    for m in modules: fully_shard(m)
    return _warm(fully_shard(pm))

def _reference(pm)->dict:
    "peft's adapter state dict of the unwrapped model (full CPU copies): what every gather must return."
    return {k: v.detach().clone() for k, v in get_peft_model_state_dict(pm).items()}

def _equal(got:dict, ref:dict)->bool: return got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)

def _bytes(tensors)->int: return sum(t.numel() * t.element_size() for t in tensors)

def counted(fn, *a, **k)->tuple:
    "(fn's result, bytes all-gathered on this rank, all-gather calls)."
    with AllGatherCounter() as c: out = fn(*a, **k)
    return out, c.bytes, c.calls

def _kit_gather(fm, ref:dict)->dict:
    got, nbytes, calls = counted(gather_lora, fm, progress=False)
    return dict(tensors=len(got), bytes=nbytes, calls=calls, equal=_equal(got, ref))

def _ref_row(res:dict, ref:dict, nbytes:int, calls:int)->dict:
    t = res.pop("tensors")
    return dict(res, tensors=len(t), bytes=nbytes, calls=calls, equal=_equal(t, ref) if t else False)

# ---------------------------------------------------------------------------------------------------------------
# the rows
# ---------------------------------------------------------------------------------------------------------------
def _unit_own_values(fm)->int:
    "Values a per-unit FSDP1 summon needs: each LoRA unit summoned alone (recurse=False), counted at the collective."
    total = 0
    for name, sub in fm.named_modules():
        if name == "" or not isinstance(sub, FSDP): continue
        nested = {n for n, m in sub.named_modules() if n != "" and isinstance(m, FSDP)}
        if not any("lora_" in n for n, _ in sub.named_parameters() if not any(n.startswith(f"{x}.") for x in nested)):
            continue
        sub._is_root = True   # as verl does, so that FSDP lets a non-root unit be summoned on its own
        with AllGatherCounter() as c, FSDP.summon_full_params(sub, writeback=False, recurse=False): pass
        sub._is_root = False
        total += c.bytes
    return total

def leaf_units(layers:int=BIG["layers"], hidden:int=BIG["hidden"], orig:bool=True)->dict:
    "verl's default LoRA policy (LoRA leaves + decoder layers), FSDP1: the collector's layered path and its fallback."
    pm = case_model("llama", r=8, layers=layers, hidden=hidden)
    ref = _reference(pm)
    out = dict(wanted=len(ref), lora_bytes=_bytes(ref.values()), model_bytes=_bytes(pm.parameters()))
    fm = _fsdp1(pm, verl_wrap_policy(pm), orig=orig)
    out["kit"] = _kit_gather(fm, ref)
    res, nb, calls = counted(verl_collect_lora_params, fm)
    out["prior"] = _ref_row(res, ref, nb, calls)
    return out

def layer_units(layers:int=BIG["layers"], hidden:int=BIG["hidden"])->dict:
    "Decoder layers as FSDP1 units (use_orig_params=True): the collector summons each whole layer."
    pm = case_model("llama", r=8, layers=layers, hidden=hidden)
    ref = _reference(pm)
    out = dict(wanted=len(ref), lora_bytes=_bytes(ref.values()), model_bytes=_bytes(pm.parameters()))
    fm = _fsdp1(pm, layer_wrap_policy(pm), orig=True)
    out["kit"] = _kit_gather(fm, ref)
    res, nb, calls = counted(verl_collect_lora_params, fm)
    out["prior"] = _ref_row(res, ref, nb, calls)
    return out

def nested_units()->dict:
    "A decoder-layer unit with an MLP unit nested inside (FSDP1, use_orig_params=True; tiny llama, LoRA r=4 on q/v)."
    pm = _nested_model()
    ref = _reference(pm)
    layer, mlp = type(pm.base_model.model.model.layers[0]), type(pm.base_model.model.model.layers[0].mlp)
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer, mlp})
    fm = _fsdp1(pm, policy, orig=True)
    out = dict(wanted=len(ref), lora_bytes=_bytes(ref.values()), kit=_kit_gather(fm, ref))
    res, nb, calls = counted(verl_collect_lora_params, fm)
    out["prior"] = _ref_row(res, ref, nb, calls)
    out["own_bytes"] = _unit_own_values(_fsdp1(_nested_model(), policy, orig=True))   # fresh: no flag left set
    return out

def _nested_model():
    "The tiny llama with LoRA r=4 on q/v, non-zero lora_B."
    from lora_fsdp_kit.models import add_lora, tiny_model
    pm = add_lora(tiny_model("llama"), r=4, alpha=8, target_modules=("q_proj", "v_proj"))
    _randomize_lora_b(pm)
    return pm

def _randomize_lora_b(pm, seed:int=2):
    "Non-zero lora_B (peft starts it at zero), so that equal tensors mean something."
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if ".lora_B." in n: p.copy_(torch.randn(p.shape, generator=g) * 0.02)

def _check_plan(plan):
    try: from lora_fsdp_kit.plan.checks import check_plan          # the checks registry, once split from plan
    except ImportError: from lora_fsdp_kit.plan.core import check_plan
    return check_plan(plan)

def size_units(min_num_params:int=5000)->dict:
    "verl's policy with min_num_params > 0 (its guard drops the LoRA leaves): LoRA sits inside size units."
    out = {}
    pm = case_model("llama")
    try: _fsdp1(pm, verl_wrap_policy(pm, min_num_params), orig=False); out["flat_error"] = None
    except Exception as e: out["flat_error"] = f"{type(e).__name__}: {e}".splitlines()[0][:120]
    pm = case_model("llama")
    errors = [f for f in _check_plan(P.plan_fsdp1(pm, verl_wrap_policy(pm, min_num_params), use_orig_params=False))
              if f.severity == "error"]
    out["plan_errors"] = [getattr(f, "id", None) or f.message[:80] for f in errors]
    ref = _reference(pm)
    fm = _fsdp1(pm, verl_wrap_policy(pm, min_num_params), orig=True)
    out.update(wanted=len(ref), kit=_kit_gather(fm, ref))
    res, nb, calls = counted(verl_collect_lora_params, fm)
    out["prior"] = _ref_row(res, ref, nb, calls)
    return out

def peft_policy(folder:str)->dict:
    "peft's own fsdp_auto_wrap_policy, FSDP1: peft's state dict and save_pretrained on torch's full state dict."
    from peft.utils.other import fsdp_auto_wrap_policy
    from safetensors.torch import load_file
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    pm = case_model("llama")
    ref = _reference(pm)
    fm = _fsdp1(pm, fsdp_auto_wrap_policy(pm), orig=False)
    out = dict(wanted=len(ref))
    with FSDP.state_dict_type(fm, StateDictType.FULL_STATE_DICT, FullStateDictConfig()):
        full = fm.state_dict()
    keys = get_peft_model_state_dict(fm.module, state_dict=full)
    d, k = Path(folder)/"peft", Path(folder)/"kit"
    if dist.get_rank() == 0: fm.module.save_pretrained(str(d), state_dict=full)
    save_lora(fm, k)
    dist.barrier()
    f = d/"adapter_model.safetensors"
    out["prior"] = dict(keys=len(keys), file_bytes=f.stat().st_size, file_tensors=len(load_file(str(f))))
    saved = load_file(str(k/"adapter_model.safetensors"))
    out["kit"] = dict(_kit_gather(fm, ref), file_bytes=(k/"adapter_model.safetensors").stat().st_size,
                      file_tensors=len(saved), file_equal=_equal(saved, ref))
    return out

def accelerate_fsdp2()->dict:
    "accelerate's FSDP2 preparation (fsdp2_prepare_model) given peft's policy: which modules it shards."
    from types import SimpleNamespace
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.fsdp_utils import fsdp2_prepare_model
    from peft.utils.other import fsdp_auto_wrap_policy
    pm = case_model("llama")
    policy = fsdp_auto_wrap_policy(pm)
    asked = [n for n, m in pm.named_modules() if n and policy(module=m, recurse=False, nonwrapped_numel=0)]
    plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy=policy, cpu_ram_efficient_loading=False,
                                            reshard_after_forward=True)
    acc = SimpleNamespace(state=SimpleNamespace(fsdp_plugin=plugin), torch_device_mesh=None, mixed_precision="no",
                          is_main_process=dist.get_rank() == 0, device=CPU, parallelism_config=None)
    fm = fsdp2_prepare_model(acc, pm)
    got = [n or "<root>" for n, m in fm.named_modules() if isinstance(m, FSDPModule)]
    kit_pm = case_model("llama")
    ref = _reference(kit_pm)
    mods = dict(kit_pm.named_modules())
    kit_fm = _fsdp2(kit_pm, [mods[n] for n in reversed(asked)])
    kit_units = [n or "<root>" for n, m in kit_fm.named_modules() if isinstance(m, FSDPModule)]
    return dict(asked=len(asked), wanted=len(ref), prior=dict(units=len(got), names=got),
                kit=dict(_kit_gather(kit_fm, ref), units=len(kit_units)))

def torchtune_fsdp2(layers:int=BIG["layers"], hidden:int=BIG["hidden"])->dict:
    "FSDP2 on each decoder layer, then the root: torchtune's adapter gather against the kit's."
    pm = case_model("llama", r=8, layers=layers, hidden=hidden)
    ref = _reference(pm)
    out = dict(wanted=len(ref), lora_bytes=_bytes(ref.values()), model_bytes=_bytes(pm.parameters()))
    fm = _fsdp2(pm, list(pm.base_model.model.model.layers))
    out["kit"] = _kit_gather(fm, ref)
    got, nb, calls = counted(torchtune_gather_adapter, fm)
    ref_tt = {f"{k.rsplit('.', 1)[0]}.default.{k.rsplit('.', 1)[1]}": v for k, v in ref.items()}
    out["prior"] = dict(tensors=len(got), bytes=nb, calls=calls,
                        equal=_equal(got, ref_tt) if dist.get_rank() == 0 else None)
    return out

# ---------------------------------------------------------------------------------------------------------------
# one launch each
# ---------------------------------------------------------------------------------------------------------------
def _guarded(fn, *a)->dict:
    import traceback
    try: return fn(*a)
    except Exception: return dict(error=traceback.format_exc()[-1200:])

def verl_rows(big:dict)->dict:
    "The rows about verl's collector (run under whichever peft the ranks import), with the kit beside it."
    import peft
    return dict(peft=peft.__version__, leaf=_guarded(leaf_units, big["layers"], big["hidden"], False),
                layer=_guarded(layer_units, big["layers"], big["hidden"]), nested=_guarded(nested_units),
                size=_guarded(size_units))

def other_rows(folder:str, big:dict)->dict:
    "The rows about peft, accelerate and torchtune, with the kit beside them."
    import accelerate, peft
    return dict(peft=peft.__version__, accelerate=accelerate.__version__, peft_policy=_guarded(peft_policy, folder),
                accelerate_fsdp2=_guarded(accelerate_fsdp2),
                torchtune_fsdp2=_guarded(torchtune_fsdp2, big["layers"], big["hidden"]))

def all_rows(folder:str, big:dict)->dict:
    "Every rank-side row in one launch."
    return dict(verl_rows(big), **other_rows(folder, big))

def small_rows(folder:str)->dict:
    "The rows that run on tiny models in seconds (for tests/test_prior_art.py)."
    return dict(leaf=_guarded(leaf_units, 2, 64, False), size=_guarded(size_units),
                peft_policy=_guarded(peft_policy, folder), accelerate_fsdp2=_guarded(accelerate_fsdp2))

"""Rank-side cases for `tests/test_gather_sharded.py`: FSDP2 sharded on dim 1 (gather, save, load against peft), the
master weights after forwards that leave units unsharded (bf16 mixed precision), no Hugging Face Hub look-up, and what
a second gather costs (no module walk, no source parsing; the view rebuilt only when the wrapping changes)."""
from __future__ import annotations

import contextlib, copy, inspect, os, tempfile, traceback
from collections import Counter
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from peft import get_peft_model_state_dict

from lora_fsdp_kit.gather.core import gather_lora
from lora_fsdp_kit.gather.sharded import sharded_view
from lora_fsdp_kit.testing.core import case_model, case_wrap, peft_reference, train_steps

def _equal(a:dict, b:dict)->bool: return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in b)

def _layers(pm:nn.Module)->list[nn.Module]: return list(pm.base_model.model.model.layers)

def wrap_fsdp2(pm:nn.Module, *, dim1:bool=False, root_only:bool=False, **kw)->nn.Module:
    "fully_shard on each decoder layer (unless `root_only`), then the root; `dim1`: Shard(1) wherever torch accepts it."
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    w = dist.get_world_size()
    if dim1: kw["shard_placement_fn"] = lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % w == 0 else None
    for layer in ([] if root_only else _layers(pm)): fully_shard(layer, **kw)
    fully_shard(pm, **kw)
    return pm

def _shared_dir()->Path:
    "One temporary folder, the same path on every rank (rank 0 makes it)."
    box = [tempfile.mkdtemp(prefix="kit-gather-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box)
    return Path(box[0])

def dim1_case()->dict:
    "FSDP2 with LoRA sharded on dim 1: gather before/after training, save and load, against peft on an unwrapped copy."
    from safetensors.torch import load_file
    from lora_fsdp_kit.export.core import load_lora, save_lora
    pm = case_model("llama")
    pristine, copy_ = get_peft_model_state_dict(pm), copy.deepcopy(pm)
    fm = wrap_fsdp2(pm, dim1=True)
    view = sharded_view(fm)
    lora_dims = sorted({p.layout.dim for n, p in view.by_name.items() if ".lora_" in n})
    res = dict(lora_dims=lora_dims, before_equal=_equal(gather_lora(fm), pristine))
    train_steps(fm, 2)
    ref, _ = peft_reference(fm, copy_)
    res["after_equal"] = _equal(gather_lora(fm), ref)
    res["changed"] = any(not torch.equal(ref[k], pristine[k]) for k in ref)
    folder = _shared_dir()/"adapter"
    save_lora(fm, folder)
    if dist.get_rank() == 0:
        saved = load_file(str(folder/"adapter_model.safetensors"))
        res["saved_equal"] = set(saved) == set(ref) and all(torch.equal(saved[k], ref[k]) for k in ref)
    fresh = wrap_fsdp2(case_model("llama"), dim1=True)   # pristine LoRA values, the same dim-1 sharding
    res["loaded"] = load_lora(fresh, folder)
    res["load_equal"] = _equal(gather_lora(fresh), ref)
    dist.barrier()
    return res

def master_case(*, root_only:bool=False, reshard_after_forward=False, bf16:bool=True)->dict:
    "After a training step and an eval forward that leaves units unsharded: gather, save = the sharded master weights."
    from safetensors.torch import load_file
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy
    from lora_fsdp_kit.export.core import save_lora
    kw = {} if reshard_after_forward is None else dict(reshard_after_forward=reshard_after_forward)   # None: torch's
    if bf16: kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    fm = wrap_fsdp2(case_model("llama"), root_only=root_only, **kw)
    train_steps(fm, 1)
    with torch.no_grad(): fm(input_ids=torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(5)))
    from torch.distributed.tensor import DTensor
    view = sharded_view(fm)   # units whose module holds a plain (unsharded) tensor now, not its sharded DTensor
    left = sum(1 for u in view.units if u.params and not isinstance(getattr(u.params[0].module, u.params[0].attr),
                                                                     DTensor))
    got = gather_lora(fm)
    folder = _shared_dir()/"adapter"
    save_lora(fm, folder)
    for m in fm.modules():
        if isinstance(m, FSDPModule): m.reshard()   # every unit sharded: what the module holds is the master now
    want = gather_lora(fm)
    res = dict(unsharded_units=left, dtypes=sorted({str(t.dtype) for t in got.values()}), equal=_equal(got, want))
    if dist.get_rank() == 0:
        saved = load_file(str(folder/"adapter_model.safetensors"))
        res["saved_equal"] = set(saved) == set(want) and all(torch.equal(saved[k], want[k]) for k in want)
    dist.barrier()
    return res

def offline_case()->dict:
    "A config naming a Hub id, HF_HUB_OFFLINE=1: gather, save and load ask nothing; peft itself would (the control)."
    import peft.utils.save_and_load as S
    from lora_fsdp_kit.export.core import load_lora, save_lora
    calls, orig = [], S.check_file_exists_on_hf_hub
    S.check_file_exists_on_hf_hub = lambda *a, **k: calls.append(a) or orig(*a, **k)
    try:
        pm = case_model("llama")
        for cfg in pm.peft_config.values(): cfg.base_model_name_or_path = "kit-test-org/no-such-model"
        copy_ = copy.deepcopy(pm)
        fm = case_wrap(pm, "layer", "fsdp2")
        got = [gather_lora(fm) for _ in range(3)]
        folder = _shared_dir()/"adapter"
        save_lora(fm, folder); load_lora(fm, folder)
        kit = len(calls)
        ref = get_peft_model_state_dict(copy_)   # peft's own helper, "auto": it looks the base model up
        return dict(kit_lookups=kit, peft_lookups=len(calls) - kit, equal=all(_equal(g, ref) for g in got),
                    offline=os.environ.get("HF_HUB_OFFLINE"))
    finally: S.check_file_exists_on_hf_hub = orig

def second_call_case(setting:str, policy:str)->dict:
    """Count module walks and source parsing during a second gather of the same model; then `iter_lora` on it: the
    bytes its collectives move (issue 19: with decoder layers as FSDP1 units it moved whole layers) and its tensors."""
    from lora_fsdp_kit.export.core import iter_lora
    from lora_fsdp_kit.memory.core import AllGatherCounter
    pm = case_model("llama")
    pristine = get_peft_model_state_dict(pm)
    fm = case_wrap(pm, policy, setting)
    with AllGatherCounter() as c: streamed = dict(iter_lora(fm))
    stream = dict(iter_equal=set(streamed) == set(pristine) and all(torch.equal(streamed[k], pristine[k])
                                                                    for k in pristine),
                  iter_bytes=c.bytes, iter_collectives=c.calls,
                  lora_bytes=sum(t.numel() * t.element_size() for t in pristine.values()))
    first = gather_lora(fm)
    counts, saved = Counter(), {}
    def counting(owner, name):
        f = getattr(owner, name); saved[(owner, name)] = f
        def wrapper(*a, **k): counts[name] += 1; return f(*a, **k)
        setattr(owner, name, wrapper)
    for owner, name in ((nn.Module, "named_modules"), (nn.Module, "modules"), (inspect, "getsource"),
                        (inspect, "getsourcelines")):
        counting(owner, name)
    try: second = gather_lora(fm)
    finally:
        for (owner, name), f in saved.items(): setattr(owner, name, f)
    return dict(setting=setting, policy=policy, counts=dict(counts), equal=_equal(first, second), **stream)

def rebuild_case()->dict:
    "The cached view is the same object while the wrapping holds, and a new one once a unit's parameters change."
    fm = case_wrap(case_model("llama"), "layer", "fsdp2")
    v1 = sharded_view(fm)
    same = sharded_view(fm) is v1
    unit = next(u for u in v1.units if u.module is not None and u.params)
    group = unit.key
    kept = group.fsdp_params
    group.fsdp_params = kept[:-1]          # as if the unit had been sharded again with other parameters
    try: v2 = sharded_view(fm)
    finally: group.fsdp_params = kept
    v3 = sharded_view(fm)
    fewer = len(v2.unit_of(unit.params[0].name).params) == len(unit.params) - 1
    # FSDP1: the view holds each unit's handle (which keeps its flat parameter): two units' handles swapped, as if
    # the units had been wrapped again, and the view is rebuilt; put back, rebuilt again, then kept
    f1 = case_wrap(case_model("llama"), "layer", "fsdp1-orig")
    w1 = sharded_view(f1)
    a, b = [u.module for u in w1.units if u.module is not None and u.params][:2]
    a._handle, b._handle = b._handle, a._handle
    try: w2 = sharded_view(f1)
    finally: a._handle, b._handle = b._handle, a._handle
    w3 = sharded_view(f1)
    return dict(same=same, rebuilt=v2 is not v1, fewer=fewer, rebuilt_back=v3 is not v2 and sharded_view(fm) is v3,
                fsdp1_same=sharded_view(f1) is w3 and w1 is not None, fsdp1_rebuilt=w2 is not w1 and w3 is not w2)

def run_all(cases:list[tuple[str, dict]])->list[dict]:
    "Rank function: each (case function name, kwargs); an error is returned as text, never raised."
    out = []
    for name, kw in cases:
        try: out.append({"case": name, **kw, **globals()[name](**kw)})
        except Exception: out.append(dict(case=name, **kw, error=traceback.format_exc()))
    return out

def _inject(fault:str, who:int):
    "The patch that makes rank `who` fail at `fault` (nothing on the other ranks)."
    from unittest import mock
    import lora_fsdp_kit.gather.core as G
    if dist.get_rank() != who or fault.startswith("in the caller"): return contextlib.nullcontext()
    def boom(*a, **k): raise MemoryError(f"injected on rank {who}: {fault}")
    if fault == "before the first collective": return mock.patch.object(G, "receive_buffer", boom)
    real, calls = G._buffers, []
    def buffers(*a, **k):   # the first collective completes, then this rank fails making the next one's buffers
        calls.append(1)
        if len(calls) == 2: boom()
        return real(*a, **k)
    return mock.patch.object(G, "_buffers", buffers)

def fault_case(fault:str, who:int, how:str)->dict:
    """A fault on rank `who` in `gather_lora` (or `iter_lora_buckets`), with 4 KiB buckets (several collectives): what
    each rank raises and how fast. Every rank must raise, naming `who` and the cause, and the group stays usable."""
    import time
    from lora_fsdp_kit.export.core import iter_lora_buckets
    fm = _fault_model()
    def read_buckets():   # the caller's own code raises between two buckets (the stream is left unread)
        for b in iter_lora_buckets(fm, bucket_bytes=4096):
            if fault == "in the caller, between buckets" and dist.get_rank() == who:
                raise MemoryError(f"injected on rank {who}: {fault}")
    run = {"gather_lora": lambda: gather_lora(fm, bucket_bytes=4096),
           "iter_lora_buckets": lambda: list(iter_lora_buckets(fm, bucket_bytes=4096)), "caller": read_buckets}[how]
    dist.barrier()
    t0, kind, msg = time.perf_counter(), None, None
    with _inject(fault, who):
        try: run()
        except Exception as e: kind, msg = type(e).__name__, str(e)
    seconds = time.perf_counter() - t0
    after = _equal(gather_lora(fm), gather_lora(fm))   # the group still works: nobody was left in a collective
    return dict(raised=kind, message=msg, seconds=seconds, usable=after, rank=dist.get_rank())

_FAULT_MODEL = []
def _fault_model()->nn.Module:
    "One FSDP1 model with decoder layers as units, shared by the fault cases (they leave it as it was)."
    if not _FAULT_MODEL: _FAULT_MODEL.append(case_wrap(case_model("llama"), "layer", "fsdp1-orig"))
    return _FAULT_MODEL[0]

def interrupt_case(who:int, buckets:bool)->dict:
    """A Ctrl-C on rank `who` while it packs its send buffer (its check's all-reduce already in flight): the copy is
    made again, so the bytes still go out. One collective: the peers get their tensors (equal to a clean gather) and
    `who` raises KeyboardInterrupt after it; 4 KiB buckets: the next check tells the peers (RankFailure naming it)."""
    from unittest import mock
    import lora_fsdp_kit.gather.core as G
    fm, kw = _fault_model(), (dict(bucket_bytes=4096) if buckets else {})
    want, real, calls = gather_lora(fm), G.pack, []
    def pack(*a, **k):   # the first copy is cut short before it starts; the next ones are real
        calls.append(1)
        if len(calls) == 1: raise KeyboardInterrupt
        return real(*a, **k)
    dist.barrier()
    got, kind, msg = None, None, None
    with (mock.patch.object(G, "pack", pack) if dist.get_rank() == who else contextlib.nullcontext()):
        try: got = gather_lora(fm, **kw)
        except BaseException as e: kind, msg = type(e).__name__, str(e)
    return dict(raised=kind, message=msg, equal=got is not None and _equal(dict(got), dict(want)), packs=len(calls),
                usable=_equal(gather_lora(fm), want), rank=dist.get_rank())

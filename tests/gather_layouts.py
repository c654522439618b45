"""Rank-side cases for the shard-arithmetic and sharded-view tests: a toy model with uneven parameter sizes wrapped by
FSDP1 (both use_orig_params, hybrid) and FSDP2 (dim 0, dim 1 via shard_placement_fn, hybrid), and the pieces each
rank really holds compared with what `lora_fsdp_kit.shards` says it holds."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from lora_fsdp_kit.gather.sharded import sharded_view
from lora_fsdp_kit.shards import fsdp1_padded_numel, fsdp2_padded_numel, shard_group

class Toy(nn.Module):
    "Uneven sizes: flat parameters and dim-0 chunks that do not divide by 3 or 4; one dim of 12 (dim-1 shardable)."
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(5, 3), nn.Linear(3, 7)
        self.c, self.e = nn.Linear(7, 12, bias=False), nn.Linear(12, 5)
        self.scale = nn.Parameter(torch.randn(1))
    def forward(self, x): return self.e(self.c(self.b(self.a(x)))) * self.scale

def _mesh(hybrid:bool):
    from torch.distributed.device_mesh import init_device_mesh
    w = dist.get_world_size()
    return init_device_mesh("cpu", (w // 2, 2) if hybrid else (w,),
                            mesh_dim_names=("replicate", "shard") if hybrid else ("shard",))

def wrap_toy(flavour:str, *, orig:bool=False, dim1:bool=False, hybrid:bool=False)->nn.Module:
    "The toy model wrapped: FSDP1 (each Linear a unit) or FSDP2 (fully_shard on a, b, c, then the root)."
    m = Toy()
    if flavour == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy
        kw = dict(sharding_strategy=ShardingStrategy.HYBRID_SHARD, device_mesh=_mesh(True)) if hybrid else {}
        return FSDP(m, auto_wrap_policy=ModuleWrapPolicy({nn.Linear}), use_orig_params=orig,
                    device_id=torch.device("cpu"), **kw)
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import Shard
    w = dist.get_world_size() // (2 if hybrid else 1) if hybrid else dist.get_world_size()
    # Shard(1) where torch accepts it (2-D, dim 1 divisible by the shard group), else FSDP2's default
    fn = (lambda p: Shard(1) if p.ndim == 2 and p.shape[1] % w == 0 else None) if dim1 else None
    mesh = _mesh(hybrid)
    for sub in (m.a, m.b, m.c): fully_shard(sub, mesh=mesh, shard_placement_fn=fn)
    fully_shard(m, mesh=mesh, shard_placement_fn=fn)
    return m

def layouts_case(flavour:str, **opts)->dict:
    "Rank function: every parameter's piece as the view says, against the tensors FSDP really holds."
    full = {n: p.detach().clone() for n, p in Toy().named_parameters()}
    fm = wrap_toy(flavour, **opts)
    view = sharded_view(fm)
    rank, out = dist.get_rank(), dict(flavour=flavour, **opts, world=dist.get_world_size(), bad=[])
    bad = out["bad"]
    # every rank's piece of every parameter, all-gathered as objects in one call (one round per case, not per piece)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, {p.name: p.local().clone() for p in view.by_name.values()})
    for u in view.units:
        for p in u.params:
            if not torch.equal(p.local(), p.piece_of(full[p.name])): bad.append(f"{p.name}: local != piece")
            # the pieces of the ranks of its shard group reassemble to the full tensor (torch.cat along dim)
            if p.group is not None:
                mine = dist.get_process_group_ranks(p.group)
                got = [every[r][p.name] for r in mine]
                if not torch.equal(p.layout.assemble(got), full[p.name]): bad.append(f"{p.name}: assemble")
                mesh = (dist.get_world_size() // 2, 2) if opts.get("hybrid") else (dist.get_world_size(),)
                if tuple(mine) != shard_group(rank, mesh)[0]: bad.append(f"{p.name}: group {mine}")
            if flavour == "fsdp2":
                real = getattr(p.module, p.attr).to_local()   # the DTensor FSDP2 put on the module
                if not torch.equal(real.reshape(-1), p.piece_of(full[p.name])): bad.append(f"{p.name}: to_local")
                if opts.get("dim1") and p.shape == (12, 7) or p.shape == (5, 12):
                    want = 1 if opts.get("dim1") and p.shape[1] % p.layout.world == 0 else 0
                    if p.layout.dim != want: bad.append(f"{p.name}: dim {p.layout.dim}")
            elif opts.get("orig"):
                real = getattr(p.module, p.attr)              # use_orig_params: a view into this rank's shard
                if not torch.equal(real.detach().reshape(-1), p.piece_of(full[p.name])):
                    bad.append(f"{p.name}: orig view")
        if flavour == "fsdp1" and u.key is not None and u.key.uses_sharded_strategy:
            fp = u.key.flat_param
            if u.gather_bytes != fp._padded_unsharded_size.numel() * fp.element_size():
                bad.append(f"{u.name}: gather bytes")
            if fsdp1_padded_numel(u.flat_numel, u.params[0].layout.world) != fp._padded_unsharded_size.numel():
                bad.append(f"{u.name}: padded numel")
        if flavour == "fsdp2" and u.params:
            want = sum(fp.padded_sharded_param_size.numel() * p.layout.world * p.dtype.itemsize
                       for fp, p in zip(u.key.fsdp_params, u.params))
            if u.gather_bytes != want: bad.append(f"{u.name}: gather bytes {u.gather_bytes} != {want}")
    out["n_params"] = len(view.by_name)
    out["dims"] = sorted({p.layout.dim for p in view.by_name.values() if p.layout})
    return out

def layouts_cases(cases:list[dict])->list[dict]:
    "Rank function: `layouts_case(**case)` for each case that fits this world size."
    w = dist.get_world_size()
    return [layouts_case(**c) for c in cases if not c.get("hybrid") or (w % 2 == 0 and w >= 4)]

"""Rank-side cases for the collective-order guard's job-scale tests (tests/test_hazards.py, bench/hazards.py): a slow
rank, a fault injected on one rank (before the first collective, between collectives, in the guard's own store
write), FSDP on a subgroup of the job and on hybrid meshes, and the guard's keys in the store over many steps."""
from __future__ import annotations

import datetime, time, warnings

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import ShardingStrategy

from lora_fsdp_kit import hazards as H, testing as T
from lora_fsdp_kit.toys import HAZARD_MODELS, hazard_batch, hazard_loss
from lora_fsdp_kit.wrap import WrapConfig

LAYER = dict(flavour="fsdp1", policy="layer", use_orig_params=True)   # decoder layers (blocks) as FSDP1 units: right
F2_LAYER = dict(flavour="fsdp2", targets="**.blocks.*")                # FSDP2 layer groups: divergent with other data


class FailingStore:
    "The default store, except that the guard's first write (`set` or `compare_set`) raises."
    def __init__(self, store): self.store, self.armed = store, True
    def __getattr__(self, name): return getattr(self.store, name)
    def _write(self, name, *a):
        if self.armed:
            self.armed = False
            raise dist.DistStoreError("injected: the store refused the write")
        return getattr(self.store, name)(*a)
    def set(self, *a): return self._write("set", *a)
    def compare_set(self, *a): return self._write("compare_set", *a)


class InterruptingStore:
    """The default store, except that the guard's first poll for its peers raises KeyboardInterrupt (a Ctrl-C while
    it waits): at once (`after=False`: a peer is still missing), or once every peer has written (`after=True`)."""
    def __init__(self, store, after:bool): self.store, self.after, self.armed = store, after, True
    def __getattr__(self, name): return getattr(self.store, name)
    def check(self, keys):
        if not self.armed: return self.store.check(keys)
        self.armed = False
        end = time.monotonic() + 30
        while self.after and not self.store.check(keys) and time.monotonic() < end: time.sleep(0.01)
        raise KeyboardInterrupt


def _wrap(name:str, spec:dict, ranks:list[int], pg, hybrid:bool):
    "The hazard model `name` wrapped as `spec` on `ranks` (a 2-D mesh, replicas × 1, when `hybrid`)."
    model, cfg = HAZARD_MODELS[name](), WrapConfig(**{"flavour": "fsdp1", **spec})   # a spec without one: FSDP1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if hybrid:   # every rank of the job builds the mesh (its groups are new groups of the whole job)
            mesh = DeviceMesh("cpu", torch.tensor(ranks).view(-1, 1), mesh_dim_names=("replicate", "shard"))
            if dist.get_rank() not in ranks: return None
            if cfg.flavour == "fsdp2": return cfg.wrap(model, mesh=mesh)
            return cfg.wrap(model, device_mesh=mesh, sharding_strategy=ShardingStrategy.HYBRID_SHARD)
        if dist.get_rank() not in ranks: return None
        kw = dict(mesh=DeviceMesh.from_group(pg, "cpu")) if cfg.flavour == "fsdp2" else dict(process_group=pg)
        return cfg.wrap(model, **kw)


def guard_case(name:str="branch",        # a hazard model of `testing` ("branch", "switch")
               spec:dict=LAYER,          # its wrapping
               same:bool=True,           # every rank gets rank 0's batch (else its own: diverges on divergent wrappings)
               fault:str|None=None,      # None, "slow", "before", "between", "write", or "ctrl-c" + " between",
                                         # " waiting" (a peer still missing) or " after all wrote"
               on:int=1,                 # the rank the fault is injected on
               delay:float=0.0,          # "slow": seconds that rank sleeps before its forward
               timeout:float|None=None,  # the guard's timeout (None: the FSDP group's)
               ranks:list[int]|None=None,# the FSDP group's ranks (default: all)
               hybrid:bool=False,        # a 2-D mesh (replicas × 1) over `ranks`
               pg_timeout:float=4.0,     # the FSDP group's timeout
              )->dict:
    "Inside a rank: one guarded forward+backward; the error each rank raised and the seconds until it did."
    rank = dist.get_rank()
    dist.barrier()   # a rank still failing out of the previous case is waited for
    ranks = ranks or list(range(dist.get_world_size()))
    pg = dist.new_group(ranks, timeout=datetime.timedelta(seconds=pg_timeout))   # every rank of the job calls it
    res = dict(rank=rank, member=rank in ranks, error=None, seconds=None, events=[], wait_s=None)
    model = _wrap(name, spec, ranks, pg, hybrid)
    if model is None: dist.barrier(); return res   # the members' barrier after their step
    ids = hazard_batch("branch" if name.startswith("branch") else name, rank, same)
    hit = fault is not None and rank == on
    g = H.check_collective_order(model, timeout=timeout)
    t0 = time.perf_counter()
    try:
        with g:
            if hit and fault == "write": g.store = FailingStore(g.store)
            if hit and fault in ("ctrl-c waiting", "ctrl-c after all wrote"):
                g.store = InterruptingStore(g.store, after=fault.endswith("wrote"))
            if fault == "ctrl-c waiting" and not hit: time.sleep(delay)   # the peer is late: the slot is taken back
            if hit and fault == "slow": time.sleep(delay)
            if hit and fault == "before": raise ValueError("injected before the first collective")
            if hit and fault in ("between", "ctrl-c between"):   # after the all-gathers of the root and 2 blocks
                block = [m for m in model.modules() if type(m).__name__ == "BranchBlock"][1]
                err = KeyboardInterrupt() if fault.startswith("ctrl-c") else ValueError("injected between collectives")
                block.register_forward_pre_hook(lambda *a: (_ for _ in ()).throw(err))
            hazard_loss(model, name, ids).backward()
    except BaseException as e: res["error"] = f"{type(e).__name__}: {e}"[:900]
    res.update(seconds=time.perf_counter() - t0, events=[e.key() for e in g.events], wait_s=getattr(g, "wait_s", None))
    dist.barrier()   # every rank has left the step: a failed step must have left none of the guard's keys behind
    if res["error"] and hasattr(g, "prefix"):
        last = g.base + g._last
        keys = [f"{g.prefix}/{j}/{q}" for j in range(max(0, last - 1), last + 2) for q in ranks]
        res["left_keys"] = [k for k in keys if g.store.check([k])]
    return res


def guard_cases(cases:list[dict])->list[dict]:
    "Inside a rank: `guard_case(**c)` for each case, in order (one launch for many cases)."
    return [guard_case(**c) for c in cases]


def guard_store_keys(steps:int=20,          # guarded steps after the first
                     name:str="branch",     # a hazard model of `testing`
                     spec:dict=LAYER,       # its wrapping
                     rounds:int=200,        # store rounds timed for the per-collective cost
                    )->dict:
    """Inside a rank: the store's key count before the first guarded step and after each step; the steps cycle
    through train, eval (no grad), gradient accumulation (two backwards) and a step that raises on every rank."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = WrapConfig(**{"flavour": "fsdp1", **spec}).wrap(HAZARD_MODELS[name]())
    ids = hazard_batch("branch" if name.startswith("branch") else name, 0, True)
    store = dist.distributed_c10d._get_default_store()
    dist.barrier()
    keys, kinds, n, t0 = [store.num_keys()], [], 0, time.perf_counter()
    for i in range(steps + 1):
        kind = ("train", "eval", "accumulate", "fail")[i % 4]
        try:
            with H.check_collective_order(model, step=i) as g:
                if kind == "eval":
                    with torch.no_grad(): hazard_loss(model, name, ids)
                for _ in range({"train": 1, "accumulate": 2, "fail": 1}.get(kind, 0)):
                    hazard_loss(model, name, ids).backward()
                if kind == "fail": raise RuntimeError("injected: the step fails on every rank")
        except RuntimeError as e:
            if "injected" not in str(e): raise
        n += len(g.events) + 1
        kinds.append(kind)
        dist.barrier()   # every rank is past its step (gloo's barrier uses no store keys)
        keys.append(store.num_keys())
        dist.barrier()
    run_s = time.perf_counter() - t0
    # the guard's own cost per collective: one round of agreeing (write, wait, read, delete) with nothing else
    g = H.check_collective_order(model, step=-1)
    g.__enter__(); g._unpatch_fsdp()
    dist.barrier(); t0 = time.perf_counter()
    for i in range(rounds): g._agree(i, "x")
    round_ms = (time.perf_counter() - t0) / rounds * 1e3
    return dict(keys=keys, kinds=kinds, steps=steps, collectives_per_step=len(g.events) or n // (steps + 1), run_s=run_s,
                round_ms=round_ms)


def guard_job(cases:list[dict],           # `guard_case` keyword sets
              steps:int=20,               # `guard_store_keys` steps (0: none)
              hazard:list[dict]|None=None,# `testing.hazard_case` keyword sets, run first (one launch for the file)
             )->dict:
    "Inside a rank: the hazard cases, the guard cases, then the store's keys over `steps` guarded steps."
    return dict(hazard=T.hazard_cases(hazard) if hazard else None, cases=guard_cases(cases),
                keys=guard_store_keys(steps) if steps else None)

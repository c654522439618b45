"""A kit collective called on some ranks only (`if is_world_process_zero: save_lora(...)`) raises on every rank that
called it within the arrival bound (LFK_ARRIVAL_TIMEOUT, a few seconds here; 60 s by default), naming the call, the
ranks that called it and those that did not, and the fix; before, the callers waited in the first check's all-reduce
for the process group's 30 minutes — on real gloo ranks, 2 (rank 0 alone) and 3 (ranks 0 and 2, rank 1 absent), for
save_lora, load_lora, gather_lora, iter_lora_buckets and iter_merged_weights; a rank that comes to such a call after
its callers gave up raises at once; calls made on every rank still work."""
import os, sys, tempfile, time
from pathlib import Path

import pytest
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks import this module
import lora_fsdp_kit.export.core as E
from lora_fsdp_kit.gather.core import gather_lora
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.gather.merged import iter_merged_weights
from lora_fsdp_kit.models import tiny_lora_model
from lora_fsdp_kit.testing.core import case_config

BOUND = 2.0   # LFK_ARRIVAL_TIMEOUT in the ranks: seconds
CALLS = {"save_lora": lambda fm, d: E.save_lora(fm, d/"partial"),
         "load_lora": lambda fm, d: E.load_lora(fm, d/"adapter"),
         "gather_lora": lambda fm, d: gather_lora(fm, progress=False),
         "iter_lora_buckets": lambda fm, d: list(E.iter_lora_buckets(fm, bucket_bytes=1536)),
         "iter_merged_weights": lambda fm, d: list(iter_merged_weights(fm, progress=False))}

def partial_calls(folder:str, callers:list[int], calls:tuple)->dict:
    "Rank function: every rank saves and gathers (all fine), then only `callers` make each of `calls`."
    os.environ["LFK_ARRIVAL_TIMEOUT"] = str(BOUND)
    rank, d = dist.get_rank(), Path(folder)
    fm = case_config("layer", "fsdp2").wrap(tiny_lora_model("llama"))
    E.save_lora(fm, d/"adapter"); whole = gather_lora(fm, progress=False)   # on every rank: go ahead as before
    out = dict(rank=rank, whole=len(whole) if rank == 0 else None, calls={})
    for name in calls:
        if rank in callers:
            t0, kind, msg = time.perf_counter(), None, None
            try: CALLS[name](fm, d)
            except Exception as e: kind, msg = type(e).__name__, str(e)
            out["calls"][name] = dict(kind=kind, message=msg, seconds=time.perf_counter() - t0)
        dist.barrier()   # the ranks that skipped the call wait here, alive (not called dead by the heartbeat)
    if rank not in callers:   # comes late to the first of those calls, after its callers gave up: raises at once
        t0 = time.perf_counter()
        try: gather_lora(fm, progress=False); out["late"] = None
        except Exception as e: out["late"] = dict(kind=type(e).__name__, message=str(e),
                                                  seconds=time.perf_counter() - t0)
    return out

@pytest.fixture(scope="module")
def runs():
    # a short launch timeout: before the fix the callers hung in the all-reduce, and the launch fails instead
    two = launch(partial_calls, tempfile.mkdtemp(prefix="lfk_partial_"), [0], tuple(CALLS), nprocs=2, quiet=True,
                 timeout=60)
    three = launch(partial_calls, tempfile.mkdtemp(prefix="lfk_partial_"), [0, 2], ("save_lora", "gather_lora"),
                   nprocs=3, quiet=True, timeout=60)
    return {2: two, 3: three}

def test_the_callers_raise_within_the_bound_naming_the_call(runs):
    for world, callers, absent in ((2, [0], [1]), (3, [0, 2], [1])):
        for r in callers:
            got = runs[world][r]["calls"]
            assert set(got) == (set(CALLS) if world == 2 else {"save_lora", "gather_lora"})
            for name, g in got.items():
                where = (world, r, name, g)
                assert g["kind"] == "PartialCall", where
                assert g["message"].startswith(f"{name} was called on ranks {callers} only; ranks {absent} did not "
                                               f"call it within {BOUND:g} s: call it on every rank (it is a "
                                               "collective), e.g. outside `if is_world_process_zero`"), where
                assert BOUND <= g["seconds"] < BOUND + 5, where

def test_calls_on_every_rank_go_ahead(runs):
    assert all(r["whole"] == 8 for rs in runs.values() for r in rs if r["rank"] == 0)
    assert all(r["calls"] == {} for w, rs in runs.items() for r in rs if r["rank"] == 1)   # rank 1 never called

def test_a_rank_that_comes_after_the_others_gave_up_raises_at_once(runs):
    for world, callers in ((2, [0]), (3, [0, 2])):
        late = runs[world][1]["late"]
        assert late["kind"] == "PartialCall" and late["seconds"] < 1, late
        assert late["message"].startswith(f"gather_lora: rank 1 came too late to this collective call: ranks "
                                          f"{callers} made it and gave up waiting for ranks [1]"), late

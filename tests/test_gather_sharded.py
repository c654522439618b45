"""On 2 gloo ranks: FSDP2 sharded on dim 1 (`shard_placement_fn`) gathers, saves and loads peft's adapter state dict of
the unwrapped model bit for bit; after an eval forward that leaves units unsharded (reshard_after_forward False or an
int, LoRA in the root unit, bf16 mixed precision) gather and save return the fp32 master weights; with a config naming
a Hub id and HF_HUB_OFFLINE=1 no gather, save or load looks anything up (peft's own helper does: the control); a second
gather walks no modules and parses no source; `iter_lora` moves only the LoRA bytes (FSDP1 decoder-layer units too)
and equals peft; a failure on either rank before or between the collectives of `gather_lora` and
`iter_lora_buckets` raises on both within seconds, naming the rank and its cause; a Ctrl-C while a rank packs (its
check already in flight) still sends its bytes: the peer gets tensors equal to a clean gather, and that rank raises
after the collective (told to the peer at the next check when there is one); the cached view is rebuilt exactly when
the wrapping changes."""
import os, sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import gather_sharded_cases as C
from lora_fsdp_kit.launch import launch

CASES = ([("dim1_case", {}), ("offline_case", {}), ("rebuild_case", {})]
         + [("master_case", kw) for kw in (dict(), dict(root_only=True, reshard_after_forward=None),
                                           dict(reshard_after_forward=1))]
         + [("second_call_case", dict(setting=s, policy=p))
            for s, p in (("fsdp1", "peft"), ("fsdp1-orig", "layer"), ("fsdp2", "layer"))]
         + [("fault_case", dict(fault=f, who=w, how=h)) for h in ("gather_lora", "iter_lora_buckets")
            for f in ("before the first collective", "between collectives") for w in (0, 1)]
         + [("fault_case", dict(fault="in the caller, between buckets", who=w, how="caller")) for w in (0, 1)]
         + [("interrupt_case", dict(who=w, buckets=b)) for w in (0, 1) for b in (False, True)])

@pytest.fixture(scope="module")
def rows():
    os.environ["HF_HUB_OFFLINE"] = "1"   # the ranks inherit it
    try: res = launch(C.run_all, CASES, nprocs=2, quiet=True, timeout=900)
    finally: os.environ.pop("HF_HUB_OFFLINE", None)
    out = [r for rank in res for r in rank]
    errors = [r["error"] for r in out if "error" in r]
    assert not errors, "\n".join(errors)
    return out

def of(rows, case): return [r for r in rows if r["case"] == case]

def test_dim1_gather_save_load_equal_peft(rows):
    for r in of(rows, "dim1_case"):
        assert r["lora_dims"] == [1], r        # every LoRA tensor really sharded on dim 1
        assert r["before_equal"] and r["after_equal"] and r["changed"] and r["load_equal"], r
        assert r["loaded"] > 0
        if "saved_equal" in r: assert r["saved_equal"], r

def test_master_weights_after_eval_forward(rows):
    got = of(rows, "master_case")
    assert len(got) == 6
    for r in got:
        assert r["dtypes"] == ["torch.float32"], r   # not the bf16 compute copy
        assert r["equal"], r
        if "saved_equal" in r: assert r["saved_equal"], r
    assert any(r["unsharded_units"] for r in got), got   # the forwards really left units unsharded

def test_no_hub_lookup(rows):
    for r in of(rows, "offline_case"):
        assert r["offline"] == "1"
        assert r["peft_lookups"] >= 1, r   # the counter sees peft's look-up: the test can fail
        assert r["kit_lookups"] == 0, r
        assert r["equal"], r

def test_second_gather_walks_nothing(rows):
    got = of(rows, "second_call_case")
    assert len(got) == 6
    for r in got:
        assert r["equal"], r
        assert r["counts"] == {}, r

def test_iter_lora_moves_only_lora_bytes(rows):
    # FSDP1 with decoder layers as units used to unshard each layer (21x the LoRA bytes); FSDP2 at 2 ranks pads nothing
    got = of(rows, "second_call_case")
    assert {r["setting"] for r in got} == {"fsdp1", "fsdp1-orig", "fsdp2"}
    for r in got:
        assert r["iter_equal"], r
        assert r["iter_bytes"] == r["lora_bytes"], r

def test_faults_raise_on_every_rank(rows):
    # issue 19: a failure on one rank before a collective or between two used to leave the peer in the collective
    got = of(rows, "fault_case")
    assert len(got) == 2 * 10
    for r in got:
        # the failed rank raises its own error; every other rank RankFailure, naming it and its cause
        if r["rank"] == r["who"]: assert r["raised"] == "MemoryError" and "injected" in r["message"], r
        else:
            assert r["raised"] == "RankFailure", r
            assert f"rank(s) [{r['who']}]" in r["message"], r
            # the caller's own error stays on its rank; its peers hear that it stopped reading the stream
            cause = "StreamClosed: the caller stopped reading" if r["how"] == "caller" else "MemoryError: injected"
            assert f"{cause}" in r["message"], r
        assert r["seconds"] < 10, r
        assert r["usable"], r

def test_view_rebuilt_when_wrapping_changes(rows):
    for r in of(rows, "rebuild_case"):
        assert r["same"] and r["rebuilt"] and r["fewer"] and r["rebuilt_back"], r
        assert r["fsdp1_same"] and r["fsdp1_rebuilt"], r

def test_interrupt_while_packing(rows):
    # the copy into the send buffer runs while the check's all-reduce is in flight: a Ctrl-C there cannot be told in
    # that check, so the copy is made again and the bytes go out; the Ctrl-C is raised after the collective
    got = of(rows, "interrupt_case")
    assert len(got) == 2 * 4
    for r in got:
        assert r["usable"], r
        if r["rank"] == r["who"]:
            assert r["raised"] == "KeyboardInterrupt" and r["packs"] >= 2, r   # cut short, then made again
        elif not r["buckets"]: assert r["raised"] is None and r["equal"], r      # the peer has its tensors
        else: assert r["raised"] == "RankFailure" and f"rank(s) [{r['who']}]" in r["message"], r

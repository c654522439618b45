"""Units that not every rank runs, on 2 gloo ranks against a single-process reference of the same step (losses and
LoRA after one SGD step): the plan's error findings fire exactly on the wrappings that really train wrong, mismatch or
hang, and not on those that run right; the collective-order guard raises on every rank exactly where the ranks part
and passes the correct runs (identical-data MoE included); a hang is killed at the launcher's timeout and the rank
status names the unit where the ranks parted. The guard runs a whole job (issue 19, item 6): it waits for a slow
rank as long as the FSDP group would and past that names it slow on every rank; a fault injected on either rank
(before the first collective, between collectives, in the guard's own store write) raises on every rank within
10 s naming the rank and the cause; it guards the FSDP group only (ranks 0-1 of 3, hybrid meshes); its store keys
do not grow with steps. Rank functions: `lora_fsdp_kit.testing.guard_runs` (nbs/95e_guard_runs.ipynb)."""
import os, sys, tempfile, time

import pytest

from lora_fsdp_kit import hazards as H
from lora_fsdp_kit.launch import launch, LaunchError
from lora_fsdp_kit.plan.wrap import WrapConfig
from lora_fsdp_kit.testing import guard_runs as G


L1 = WrapConfig(flavour="fsdp1", policy="lora", use_orig_params=True)     # LoRA leaves as FSDP1 units (peft's preset)
LAYER = G.LAYER                                                             # decoder layers (blocks) as FSDP1 units
F2_LAYER = G.F2_LAYER
F2_LEAVES = WrapConfig(flavour="fsdp2", targets=["**.lora_A.*", "**.lora_B.*", "**.blocks.*"])
RIGHT, WRONG = "right", "wrong"
# (case, what really happens with different data per rank); the expectation is asserted, and compared with the plan
CASES = [
    (dict(name="branch", spec=L1), WRONG),                 # expert 0's leaf paired with expert 1's: silent
    (dict(name="branch", spec=L1, same=True), RIGHT),      # identical data hides it
    (dict(name="branch", spec=LAYER), RIGHT),              # FSDP1 layer units: the flat parameter runs everywhere
    (dict(name="branch", spec=F2_LAYER), WRONG),           # FSDP2 reduce-scatters only the grads it got
    (dict(name="branch", spec=F2_LEAVES), WRONG),
    (dict(name="llama", spec=WrapConfig(flavour="fsdp1", policy="leaves+size", min_num_params=3000,
                                        use_orig_params=True)), RIGHT),
    (dict(name="switch", spec=LAYER), RIGHT),              # a real transformers MoE, layer units
    (dict(name="switch", spec=L1, same=True), RIGHT),
]
GUARDED = [   # (case, the guard raises)
    (dict(name="branch", spec=L1, guard=True), True),
    (dict(name="branch", spec=F2_LAYER, guard=True), True),
    (dict(name="switch", spec=L1, guard=True), True),      # unguarded, gloo dies: see the notebook
    (dict(name="branch_drop", spec=LAYER, conditional="**.blocks.1", guard=True), True),  # a dropped layer
    (dict(name="branch", spec=LAYER, guard=True), False),
    (dict(name="switch", spec=L1, same=True, guard=True), False),
    (dict(name="switch", spec=LAYER, guard=True), False),
]


# --- A guard that can run a whole job (issue 19, item 6): slow ranks, faults, subgroups, hybrid meshes, the store ---
SLOW = 1.5   # seconds a slow rank sleeps (the 8 s, scaled); the FSDP group's timeout is 4 s
JOB = ([dict(fault="slow", on=1, delay=SLOW)]                                       # within the group's timeout
       + [dict(fault="slow", on=q, delay=SLOW, timeout=0.5) for q in (0, 1)]        # past the guard's timeout
       + [dict(fault=f, on=q, timeout=2.0) for f in ("before", "between", "write") for q in (0, 1)]
       + [dict(fault="ctrl-c between", on=q, timeout=2.0) for q in (0, 1)]                # Ctrl-C (issue 19)
       + [dict(fault="ctrl-c waiting", on=1, delay=1.0, timeout=3.0),
          dict(fault="ctrl-c after all wrote", on=0, timeout=3.0)]
       + [dict(spec=G.F2_LAYER, same=False, hybrid=True, timeout=2.0),              # FSDP2, 2 replicas x 1 shard
          dict(hybrid=True, timeout=2.0)])                                          # FSDP1 HYBRID_SHARD, 2 x 1
STEPS = 100   # guarded steps counting the store's keys: train, eval, accumulation and failed steps in turn


@pytest.fixture(scope="module")
def launched():
    "One launch for the file's 2-rank cases: the hazard cases, the guard's job cases, its store keys over steps."
    cases = [c for c, _ in CASES + GUARDED]
    t0 = time.perf_counter()
    res = launch(G.guard_job, JOB, STEPS, hazard=cases, quiet=True, timeout=400)
    print(f"{len(cases)} hazard cases, {len(JOB)} guard cases and {STEPS} guarded steps on 2 ranks in "
          f"{time.perf_counter() - t0:.1f} s")
    return cases, res


@pytest.fixture(scope="module")
def runs(launched):
    cases, res = launched
    refs = {}
    for c in cases:
        k = (c["name"], c.get("same", False))
        if k not in refs and c["name"] != "branch_drop": refs[k] = G.hazard_reference(*k[:1], same=k[1])
    return cases, [[r["hazard"][i] for r in res] for i in range(len(cases))], refs


def _label(c): return f"{c['name']} {c['spec'].label} same={c.get('same', False)} guard={c.get('guard', False)}"


def test_real_outcomes(runs):
    cases, ranks, refs = runs
    for (c, want), rk in zip(CASES, ranks):
        assert G.hazard_outcome(rk, refs[(c["name"], c.get("same", False))]) == want, _label(c)


def test_finding_fires_exactly_where_the_run_goes_wrong(runs):
    "Wrapping-level prediction: with different data per rank, an error finding of the hazard checks iff not right."
    cases, ranks, refs = runs
    hazard = {"rank-divergent-unit", "rank-divergent-grads"}
    for (c, want), rk in zip(CASES, ranks):
        if c.get("same"): continue   # identical data runs right whatever the wrapping; the guard covers it
        fired = bool(hazard & set(rk[0]["findings"]))
        assert fired == (want != RIGHT), (_label(c), rk[0]["findings"])
    # the dense Llama of the old deadlock claim: no error at all, only the double-gather warning remains
    llama = next(rk for (c, _), rk in zip(CASES, ranks) if c["name"] == "llama")
    assert llama[0]["findings"] == [] and llama[0]["events"] == llama[1]["events"]


def test_guard_raises_on_every_rank_where_ranks_part(runs):
    cases, ranks, refs = runs
    for (c, raises), rk in zip(GUARDED, ranks[len(CASES):]):
        errs = [r["error"] for r in rk]
        if not raises:
            assert errs == [None, None], (_label(c), errs)
            assert G.hazard_outcome(rk, refs[(c["name"], c.get("same", False))]) == RIGHT, _label(c)
            continue
        assert all(e and e.startswith("CollectiveOrderError: step 0: ranks part at FSDP collective #") for e in errs), errs
        assert errs[0] == errs[1], errs                                     # the same divergence named on both
        i = H.first_divergence([r["events"] for r in rk])
        assert f"collective #{i}:" in errs[0] and all(len(r["events"]) == i + 1 for r in rk), (_label(c), i, errs[0])
    # what each rank did is named: FSDP1 expert leaves; FSDP2 the parameter sets of one reduce-scatter
    e = dict((_label(c), rk[0]["error"]) for (c, _), rk in zip(GUARDED, ranks[len(CASES):]))
    assert "experts.0.up.lora_A" in e[_label(GUARDED[0][0])] and "experts.1.up.lora_A" in e[_label(GUARDED[0][0])]
    assert "reduce_scatter base_model.model.blocks.1" in e[_label(GUARDED[1][0])]
    assert "rank 0: all_gather base_model.model.blocks.1 " in e[_label(GUARDED[3][0])]


def test_unguarded_recording_shows_where_ranks_part(runs):
    "The silent case: both ranks issue the same number of same-sized collectives, only the units differ."
    cases, ranks, refs = runs
    rk = ranks[0]
    a, b = rk[0]["events"], rk[1]["events"]
    i = H.first_divergence([a, b])
    assert len(a) == len(b) and i is not None and "experts.0" in a[i] and "experts.1" in b[i]
    assert a[i].split("(")[1] == b[i].split("(")[1]   # same size: gloo cannot tell
    fig = H.plot_collective_orders([a, b], "branch, LoRA leaves")
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == ["rank 0", "rank 1"]


def test_hang_is_killed_at_the_timeout_and_the_status_names_the_unit(monkeypatch):
    "A layer that one rank drops, layer units: both ranks wait forever; the launcher kills them at its timeout."
    status = tempfile.mkdtemp(prefix="lfk_status_")
    monkeypatch.setenv(H.STATUS_ENV, status)   # the launcher may set its own; then its message carries the text
    t0 = time.perf_counter()
    # 10 s (it was 20): 5 s was enough for the ranks to reach the hang on a quiet machine, not at load 10 (measured);
    # their collectives would wait 600 s
    with pytest.raises(LaunchError) as e:
        launch(G.hazard_case, "branch_drop", LAYER, guard="record", wait=600, quiet=True, timeout=10)
    assert time.perf_counter() - t0 < 75   # the timeout counts from when every rank has joined
    text = str(e.value) + "".join(open(os.path.join(status, f)).read() for f in os.listdir(status))
    assert "did not finish within 10" in str(e.value) or "timed out" in str(e.value).lower(), str(e.value)
    assert "all_gather base_model.model.blocks.1" in text, text


@pytest.fixture(scope="module")
def job(launched):
    res = launched[1]
    return [[r["cases"][i] for r in res] for i in range(len(JOB))], [r["keys"] for r in res]


def _by(job, **kw):
    "The ranks' results of the first case of JOB with these settings."
    dflt = dict(spec=G.LAYER)
    return next(rk for c, rk in zip(JOB, job[0]) if all(c.get(k, dflt.get(k)) == v for k, v in kw.items()))


def test_slow_rank_is_waited_for_as_long_as_its_group_would(job):
    rk = _by(job, fault="slow", timeout=None)
    assert [r["error"] for r in rk] == [None, None] and [r["wait_s"] for r in rk] == [4.0, 4.0], rk
    assert rk[0]["seconds"] > SLOW - 0.2 and rk[0]["events"] == rk[1]["events"]


def test_slow_rank_past_the_timeout_is_named_slow_on_every_rank(job):
    for q in (0, 1):
        rk = _by(job, fault="slow", on=q, timeout=0.5)
        for r in rk:
            assert r["error"].startswith(f"SlowRankError: step 0: rank {q} did not reach FSDP collective #0 within "
                                         f"0.5 s (rank {1 - q} stopped waiting)"), r["error"]
            assert "not a divergent one" in r["error"] and r["seconds"] < 10, r
        assert rk[1 - q]["seconds"] < SLOW - 0.3   # the waiting rank raised at its timeout, not after the slow one
        assert rk[0]["error"] == rk[1]["error"]


@pytest.mark.parametrize("fault", ["before", "between", "write"])
def test_a_fault_on_one_rank_raises_on_every_rank_naming_it(job, fault):
    for q in (0, 1):
        rk = _by(job, fault=fault, on=q)
        mine, other = rk[q]["error"], rk[1 - q]["error"]
        assert all(r["seconds"] < 10 for r in rk), rk
        cause = "DistStoreError: injected" if fault == "write" else f"ValueError: injected {fault}"
        assert (mine.startswith(f"GuardError: step 0: rank {q}'s guard failed") if fault == "write"
                else mine.startswith("ValueError: injected")), mine
        assert other.startswith("PeerStoppedError: step 0: before FSDP collective #") and f"rank {q} stopped" in other
        assert cause in other, other
        i = int(other.split("#")[1].split(",")[0])
        assert len(rk[1 - q]["events"]) == i + 1 and len(rk[q]["events"]) == i + (fault == "write"), (i, rk)


def test_guard_on_hybrid_meshes(job):
    f2, f1 = _by(job, hybrid=True, spec=G.F2_LAYER), _by(job, hybrid=True, spec=G.LAYER)
    assert all(r["error"].startswith("CollectiveOrderError: step 0: ranks part at") for r in f2), f2
    assert f2[0]["error"] == f2[1]["error"]
    assert [r["error"] for r in f1] == [None, None] and f1[0]["events"] == f1[1]["events"], f1


def test_store_keys_stay_bounded(job):
    keys = job[1]
    assert len(keys[0]["keys"]) == STEPS + 2 and set(keys[0]["kinds"]) == {"train", "eval", "accumulate", "fail"}
    assert len(set(keys[0]["keys"])) == 1, keys[0]["keys"]   # after every step as many keys as before the first
    assert keys[0]["collectives_per_step"] > 5


def test_guard_works_on_a_subgroup_and_a_hybrid_mesh_of_it():
    "FSDP on ranks 0-1 of 3: the guard compares those two only; rank 2 runs no FSDP at all."
    sub = dict(ranks=[0, 1], timeout=2.0)
    cases = [dict(sub, same=False), dict(sub, spec=G.F2_LAYER, same=False), dict(sub, spec=G.F2_LAYER, hybrid=True)]
    res = launch(G.guard_job, cases, 0, nprocs=3, quiet=True, timeout=200)
    right, parted, hybrid = [[r["cases"][i] for r in res] for i in range(len(cases))]
    assert [r["member"] for r in right] == [True, True, False]
    assert [r["error"] for r in right] == [None, None, None] and right[0]["events"] == right[1]["events"], right
    assert [r["error"] for r in hybrid] == [None, None, None], hybrid
    assert all(r["error"].startswith("CollectiveOrderError: step 0: ranks part") for r in parted[:2]), parted
    assert "rank 2" not in parted[0]["error"] and parted[2]["error"] is None


CTRL_C = ("ctrl-c between", "ctrl-c waiting", "ctrl-c after all wrote")

def test_ctrl_c_on_one_rank_reaches_the_others(job):
    "A Ctrl-C on one rank, between collectives or while the guard waits: the others raise at once, naming it."
    seen = set()
    for c, rk in zip(JOB, job[0]):
        if c.get("fault") not in CTRL_C: continue
        q, seen = c["on"], seen | {c["fault"]}
        assert rk[q]["error"].startswith("KeyboardInterrupt"), (c, rk[q]["error"])
        other = rk[1 - q]
        assert other["error"].startswith("PeerStoppedError") and f"rank {q} stopped: KeyboardInterrupt" in other["error"], (c, other)
        # well under the FSDP group's 4 s (waited out before, as the gloo timeout): the late peer's own delay only
        assert all(r["seconds"] < 3.0 for r in rk), (c, [r["seconds"] for r in rk])
    assert seen == set(CTRL_C)

def test_a_failed_step_leaves_no_guard_keys(job):
    bad = [(c, r["rank"], r["left_keys"]) for c, rk in zip(JOB, job[0]) for r in rk if r["error"] and r.get("left_keys")]
    assert not bad, bad


def after_a_divergence(flavour:str)->list[str]:
    "Rank function: a clean step, a divergent one (the guard raises), then two on identical data."
    import datetime
    import torch.distributed as dist
    from lora_fsdp_kit.testing.toys import HAZARD_MODELS, hazard_batch, hazard_loss
    spec = L1 if flavour == "fsdp1" else F2_LAYER
    model = spec.wrap(HAZARD_MODELS["branch"](), dist.new_group(timeout=datetime.timedelta(seconds=8)))
    same, out = hazard_batch("branch", 0, True), []
    for step, ids in ((1, same), (2, hazard_batch("branch", dist.get_rank(), False)), (3, same), (4, same)):
        try:
            with H.check_collective_order(model, step=step, timeout=4.0): hazard_loss(model, "branch", ids).backward()
            out.append("ok")
        except Exception as e: out.append(f"{type(e).__name__}: {e}")
        model.zero_grad(set_to_none=True)
    return out

@pytest.mark.parametrize("flavour", ["fsdp1", "fsdp2"])
def test_after_the_guard_raised(flavour):
    # FSDP1 stopped inside an unshard keeps each rank's units in a state of their own: every later step on identical
    # data parted at collective #0 (said wrongly as a divergence), and an unguarded one aborted in gloo. Now the
    # first error says to wrap again, and a later guarded step says why at once; FSDP2 runs on
    got = launch(sys.modules[__name__].after_a_divergence, flavour, nprocs=2, quiet=True, timeout=120)
    for r in got:
        assert r[0] == "ok" and r[1].startswith("CollectiveOrderError: step 2: ranks part"), r
        if flavour == "fsdp2": assert r[2:] == ["ok", "ok"], r; continue
        assert "wrap the model again before the next step" in r[1], r[1]
        assert all(x.startswith("GuardError: this FSDP1-wrapped model was stopped inside a collective by the guard "
                                "at step 2") for x in r[2:]), r

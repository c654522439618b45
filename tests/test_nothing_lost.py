"""Nothing lost, nothing mixed, nobody left waiting — on gloo ranks the test forks itself on a store it hosts (as
torchrun starts them), FSDP1 and FSDP2, 2 and 3 ranks. `save_lora` changes only the adapter's own files: every byte
of every file beside it (a Trainer checkpoint, a nested adapter) is kept, a symlink is followed, and a read-only or
full target keeps the previous adapter; `load_lora` ends with the previous adapter on every rank or the new one on
every rank, whatever rank is interrupted at whatever stage (checked bit for bit by a gather against both); a rank
killed outright is named by every survivor within 10 s, and a slow one is waited for, with one line every 10 s and
none of c10d's polling warnings; ranks at different calls raise at once, with no data returned."""
import contextlib, os, shutil, subprocess, sys, tempfile, time
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nothing_lost_cases as C
import lora_fsdp_kit.export.core as E
from lora_fsdp_kit.testing.core import covering_array

OWN = (E.ADAPTER_WEIGHTS, E.ADAPTER_CONFIG, "README.md")   # what a save writes, and all it may change
TRAINER = {"optimizer.pt": b"adam state", "scheduler.pt": b"cosine", "trainer_state.json": b'{"global_step": 100}',
           "rng_state_0.pth": b"rng", "training_args.bin": b"args"}

def files(d:Path)->dict:
    "Every file under `d`, by relative path, with its bytes (symlinks followed)."
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}

def beside(d:Path)->dict: return {k: v for k, v in files(d).items() if k not in OWN}

@contextlib.contextmanager
def mounted(path:Path, opts:str):
    "A tmpfs (or a read-only bind) at `path` for the block: root only (the CI's machines); None where it cannot."
    if os.geteuid() != 0: yield False; return
    ok = subprocess.run(["mount", *opts.split(), str(path)], capture_output=True).returncode == 0
    try: yield ok
    finally:
        if ok: subprocess.run(["umount", "-l", str(path)], capture_output=True)

def _need(ok:bool, what:str):
    if not ok:
        if os.environ.get("CI") == "true": pytest.fail(f"{what}: cannot mount here (root and mount are needed)")
        pytest.skip(f"{what}: cannot mount here (root and mount are needed)")


@pytest.mark.parametrize("flavour", ["fsdp1", "fsdp2"])
def test_save_keeps_what_sits_beside(flavour):
    root = Path(tempfile.mkdtemp(prefix="lfk_beside_"))
    old = C.lora_model(0)
    ck, out, real = root/"checkpoint-100", root/"out", root/"ckpts"/"step-2"
    for d in (ck, out, out/"step-100", real): old.save_pretrained(d)
    for f, data in TRAINER.items(): (ck/f).write_bytes(data)
    (ck/"step-100").mkdir(); old.save_pretrained(ck/"step-100")                  # another adapter inside
    (root/"ckpts"/"latest").symlink_to(real, target_is_directory=True)
    ref = root/"ref"; C.lora_model(1).save_pretrained(ref)                    # what save_pretrained writes
    ro, full = root/"ro", root/"full"
    for d in (ro, full): d.mkdir()
    old.save_pretrained(ro/"adapter"); (ro/"adapter"/"notes.txt").write_text("mine")
    with mounted(ro, f"--bind -o ro {ro}") as ro_ok, mounted(full, "-t tmpfs -o size=96k tmpfs") as full_ok:
        if ro_ok: subprocess.run(["mount", "-o", "remount,ro,bind", str(ro)], check=True)
        if full_ok:   # an adapter and a file beside it, and the rest of the disk filled
            old.save_pretrained(full/"adapter"); (full/"adapter"/"optimizer.pt").write_bytes(b"x" * 4096)
            with contextlib.suppress(OSError), open(full/"filler", "wb", buffering=0) as f:
                while True: f.write(b"\0" * 1024)
        targets = {"trainer": ck, "nested-outer": out, "nested-inner": out/"step-100",
                   "symlink": root/"ckpts"/"latest", "read-only": ro/"adapter", "full": full/"adapter"}
        before = {k: files(p) for k, p in targets.items() if p.exists()}
        res = C.start(C.save_targets, 2, flavour, [str(p) for p in targets.values()])
        after = {k: files(p) for k, p in targets.items() if p.exists()}
        left = sorted(str(p) for d in (root, root/"ckpts", out, full) for p in d.glob(".*.saving-*"))
    assert all(r is not None and "crash" not in r for r in res), res
    errors = {k: [r[str(p)] for r in res] for k, p in targets.items()}
    new = {f: (ref/f).read_bytes() for f in OWN}
    for k in ("trainer", "nested-outer", "nested-inner", "symlink"):
        assert errors[k] == [None, None], (k, errors[k])
        assert {f: after[k][f] for f in OWN} == new, k                         # peft's bytes, all three files
        kept = {f: v for f, v in before[k].items() if f not in OWN and not (k == "nested-outer" and
                                                                           f.startswith("step-100/"))}
        assert {f: after[k][f] for f in kept} == kept, k                       # every byte beside it
    assert set(beside(ck)) == {*TRAINER, *(f"step-100/{f}" for f in OWN)}
    assert (root/"ckpts"/"latest").is_symlink() and files(real) == files(root/"ckpts"/"latest")
    if ro_ok:
        assert all(e.startswith("SaveError") and "not writable" in e for e in errors["read-only"]), errors
        assert after["read-only"] == before["read-only"]
    if full_ok:
        assert all(e.startswith("SaveError") and "No space left" in e for e in errors["full"]), errors
        assert after["full"] == before["full"]                                 # the previous adapter, byte for byte
    assert left == [], left                                                     # no temporary folder outlives a save
    _need(ro_ok and full_ok, "read-only and full-disk targets")


LOAD_STAGES = ["start", "ready", "read", "write", "exception", "waiting", "after the word"]
SETTINGS = {"fsdp2": 2, "fsdp1": 3}   # flavour -> world
# stage x victim x setting (32 cases) as a pairwise covering array: every stage on every rank, every stage and every
# rank under both flavours, at least once ("ready" is rank 0's own stage; rank 2 exists on 3 ranks only)
LOAD_CASES = covering_array(dict(stage=LOAD_STAGES, victim=[0, 1, 2], flavour=list(SETTINGS)),
                            allowed=lambda r: r["victim"] < SETTINGS[r["flavour"]] and
                                              (r["stage"] != "ready" or r["victim"] == 0))

@pytest.mark.parametrize("flavour,world", list(SETTINGS.items()))
def test_load_is_all_or_nothing(flavour, world):
    "Every stage on every rank, sampled (`LOAD_CASES`); each followed by a gather compared with both adapters."
    cases = [(r["stage"], r["victim"]) for r in LOAD_CASES if r["flavour"] == flavour]
    res = C.start(C.load_interrupts, world, flavour, cases, timeout=400)
    assert all(r is not None and "crash" not in r for r in res), [r and r.get("crash") for r in res]
    for i, (stage, victim) in enumerate(cases):
        rows = [r["rows"][i] for r in res]
        n = rows[0]["n"]
        kept_new = stage == "after the word"
        assert n == 8 and all(r["same_a"] == (0 if kept_new else n) for r in rows), (stage, victim, rows)
        assert rows[0]["same_b"] == (n if kept_new else 0), (stage, victim, rows[0])
        for r in rows:
            if kept_new:
                assert r["error"] is None or "had already completed on every rank" in r["error"], r
            elif r is rows[victim]:
                assert r["error"].startswith(("KeyboardInterrupt", "LoadError")), r
                assert ("previous adapter on every rank" in r["error"] or "left as it was on every rank" in
                        r["error"]), r
            else:
                assert r["error"].startswith("LoadError: load_lora failed on rank(s) [%d]" % victim), r
                assert "the model was left as it was on every rank" in r["error"], r


KILLS = [("save", "after the gather", 1), ("save", "voting", 1), ("save", "writing", 0),
         ("load", "voting", 1), ("load", "writing", 0), ("stream", "after bucket 1", 1)]

def test_a_killed_rank_is_named_within_10_s():
    "Each case in its own pair of ranks, all at once (the survivors mostly wait)."
    *runs, slow = C.start_all(C.killed, 2, [*KILLS, ("load", "slow", 1)])
    for (op, stage, victim), res in zip(KILLS, runs):
        assert res[victim] is None, (op, stage, "the victim was not killed", res[victim])
        s = res[1 - victim]
        assert s is not None and "crash" not in s, (op, stage, s)
        assert s["error"] is not None and (f"rank(s) [{victim}]" in s["error"] or "Connection" in s["error"]), s
        assert s["raised_at"] - s["killed_at"] <= 10, (op, stage, s["raised_at"] - s["killed_at"])
        if op == "load": assert s["kept_own_shards"], (op, stage)              # the survivor put its shards back
        if op == "save":   # the previous adapter is intact; a later save cleans what the killed one left
            target = Path(s["out"])/"adapter"
            published = "the new adapter is at" in s["error"]   # rank 0 published before it found the peer gone
            assert files(target) == files(Path(s["out"])/("new" if published else "a-before")), (op, stage)
            E.save_lora(C.lora_model(2), target)
            assert list(target.parent.glob(".adapter.saving-*")) == [], (op, stage)
    ok = slow[0]
    assert all(r is not None and r["error"] is None for r in slow), slow        # slow, not dead: it was waited for
    waits = [l for l in ok["stderr"].splitlines() if "has waited" in l]
    assert len(waits) == 1 and "for rank(s) [1] to reach 'written'" in waits[0], ok["stderr"][-2000:]
    assert "waitForInput" not in ok["stderr"] + slow[1]["stderr"]


def test_ranks_at_different_calls_raise_with_no_data():
    res = C.start(C.parted, 2)
    assert all(r is not None and "crash" not in r for r in res), res
    r0, r1 = res
    assert r0["stream"].startswith("CallMismatch") and r1["retry"].startswith("CallMismatch"), (r0, r1)
    for r in (r0["stream"], r1["retry"]):
        assert "iter_lora_buckets (call" in r and "gather_lora (call" in r, r
    assert max(r0["seconds"], r1["seconds"]) < 10
    assert r0["skip"].startswith("CallMismatch") and r1["skip"].startswith("CallMismatch"), (r0["skip"], r1["skip"])
    assert "save_lora (call" in r0["skip"] and "load_lora (call" in r0["skip"]


STATES = ["fsdp2", "fsdp2-keep", "fsdp2-root", "fsdp1", "fsdp1-grad-op"]

def test_any_state_a_forward_leaves():
    """Train or eval, resharded after forward or not, FSDP1 and FSDP2: gather, save and load stay bitwise peft's, and
    the next forward computes with the loaded adapter."""
    res = C.start(C.forward_states, 2, STATES)
    assert all(r is not None and "crash" not in r for r in res), res
    rows = [row for r in res for row in r["rows"]]
    bad = [row for row in rows if "error" in row or not (row["gather"] and row["load"] and row["forward"] and row.get("save", True))]
    assert not bad, bad
    assert len(rows) == 2 * 2 * len(STATES)

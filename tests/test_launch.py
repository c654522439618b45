"""The launcher with real processes: whatever stops the process that called `launch` (SIGTERM, SIGINT, SIGHUP, SIGKILL),
no rank, janitor or resource tracker survives it and its `lfk_launch_*` folder is gone; a script that calls `launch()`
outside `if __name__ == "__main__":` is refused with the fix in the message; what a rank returns (hundreds of tensors
included) comes back equal, bit for bit, to what the rank built."""
import os, signal, subprocess, sys, textwrap, time
from pathlib import Path

import psutil
import pytest

from procs import rank_processes

# Each rank reports a status and then sleeps: the parent is stopped while its ranks are running.
CASES = '''
import time
from lora_fsdp_kit.launch import report_status
def wait_forever():
    report_status("ready")
    time.sleep(600)
'''

PARENT = '''
import sys
from lora_fsdp_kit.launch import launch
import lfk_signal_cases
if __name__ == "__main__":
    launch(lfk_signal_cases.wait_forever, nprocs=2, quiet=True)
'''

def _env(tmp:Path, **extra)->dict:
    "The test's environment with a private temp folder (the launch folder goes there) and the case module importable."
    path = os.pathsep.join([str(tmp), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "TMPDIR": str(tmp/"t"), "PYTHONPATH": path, **extra}

def _wait_until(cond, timeout:float, what:str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond(): return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")

def _ready(tmp:Path)->bool:
    "Both ranks have reported 'ready' in the launch folder."
    runs = list((tmp/"t").glob("lfk_launch_*"))
    return len(runs) == 1 and all((runs[0]/f"rank{r}.txt").exists() and (runs[0]/f"rank{r}.txt").read_text() == "ready"
                                  for r in (0, 1))

def _default_signals():
    "The dispositions a launcher started from a terminal has: a CI runner may start tests with SIGINT and SIGHUP ignored"
    # (a background job without job control ignores SIGINT; nohup ignores SIGHUP), which a child inherits
    for s in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM): signal.signal(s, signal.SIG_DFL)

# Every signal once and both start methods (4 launches, where every signal with each method took 6 or 8): SIGKILL, which
# no handler sees, on the fork server (the longest chain to clean up: server, resource tracker, ranks); SIGINT, whose
# exit code is a re-raised KeyboardInterrupt's, on it too; SIGTERM and SIGHUP, the handled ones, with spawn (its ranks
# are the launcher's own children)
@pytest.mark.parametrize("sig, code, method", [(signal.SIGKILL, -signal.SIGKILL, "forkserver"),
                                               (signal.SIGINT, -signal.SIGINT, "forkserver"),
                                               (signal.SIGTERM, 128 + 15, "spawn"),
                                               (signal.SIGHUP, 128 + 1, "spawn")])
def test_nothing_outlives_the_launcher(tmp_path, sig, code, method):
    (tmp_path/"t").mkdir()
    (tmp_path/"lfk_signal_cases.py").write_text(CASES); (tmp_path/"parent.py").write_text(PARENT)
    p = subprocess.Popen([sys.executable, str(tmp_path/"parent.py")], env=_env(tmp_path, LFK_START_METHOD=method),
                         start_new_session=True,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_default_signals)
    try:
        _wait_until(lambda: _ready(tmp_path) or p.poll() is not None, 240, "both ranks to report 'ready'")
        assert p.poll() is None, p.stdout.read().decode()
        family = psutil.Process(p.pid).children(recursive=True)
        names = sorted(" ".join(c.cmdline()) for c in family)
        assert len(rank_processes(family)) == 2, names                           # the two ranks
        assert sum("multiprocessing.forkserver" in n for n in names) == (3 if method == "forkserver" else 0), names
        assert sum("resource_tracker" in n for n in names) == 1, names          # multiprocessing's tracker
        assert sum("shutil" in n for n in names) == 1, names                    # the janitor
        p.send_signal(sig)
        out = p.communicate(timeout=60)[0].decode()
        assert p.returncode == code, (p.returncode, out)
        gone, alive = psutil.wait_procs(family, timeout=30)
        assert not alive, [" ".join(c.cmdline())[:80] for c in alive]
        _wait_until(lambda: not list((tmp_path/"t").glob("lfk_launch_*")), 15, "the launch folder to be removed")
    finally:
        if p.poll() is None: p.kill()
        p.wait()

def test_unguarded_script_is_refused(tmp_path):
    (tmp_path/"t").mkdir()
    script = tmp_path/"train.py"
    script.write_text(textwrap.dedent('''
        import os
        from lora_fsdp_kit.launch import launch
        def main(): return launch(os.getpid)
        print("before")
        main()                       # line 6: at the top level, no __main__ guard
    '''))
    r = subprocess.run([sys.executable, str(script)], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert f"{script} calls launch() at line 6 outside `if __name__ == \"__main__\":`" in last, r.stderr
    assert "put the code that calls `launch` under" in last
    assert r.stdout.count("before") == 1        # refused before any rank started (a rank would print it again)
    assert not list((tmp_path/"t").glob("lfk_launch_*"))   # and before the launch folder was made
    # the same script, guarded, runs
    script.write_text(script.read_text().replace("main()  ", 'if __name__ == "__main__": print(main())  '))
    r = subprocess.run([sys.executable, str(script)], env=_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("before") == 3        # the parent and each rank (spawn imports the script in each rank)

# What a gathered adapter is: hundreds of CPU tensors of several dtypes, some views into one storage, each rank's own.
# Before the launcher sent results as a plain pickle, such a dict failed in torch's file-descriptor sharing
# (ConnectionResetError, FileNotFoundError) or as "rank 0 closed its pipe without a result".
MANY = '''
import torch, torch.distributed as dist
def adapter(n, numel):
    g = torch.Generator().manual_seed(dist.get_rank())
    out = {}
    for i in range(n):
        dt = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
        out[f"model.layers.{i}.self_attn.q_proj.lora_A.weight"] = torch.randn(8, numel, generator=g).to(dt)
    base = torch.arange(4 * numel, dtype=torch.float32)
    out["views"] = [base[:numel], base[numel:].view(3, numel)]
    out["float8"] = torch.linspace(-4, 4, numel).to(torch.float8_e4m3fn)   # torch's own pickle cannot load it back
    return out

def dtensor():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    return {"w": distribute_tensor(torch.arange(8.0), init_device_mesh("cpu", (2,)), [Shard(0)])}
'''

# The default start method only: results travel through the same pipe whichever way the ranks started, and spawn's
# start-up is proved above (its ranks' own imports of torch cost a launch 2 more interpreters' start-up)
@pytest.mark.parametrize("method", ["forkserver"])
def test_many_tensors_come_back(tmp_path, monkeypatch, method):
    (tmp_path/"lfk_many_cases.py").write_text(MANY)
    monkeypatch.syspath_prepend(str(tmp_path)); monkeypatch.setenv("LFK_START_METHOD", method)
    import torch, lfk_many_cases
    from lora_fsdp_kit.launch import launch
    res = launch(lfk_many_cases.adapter, 400, 64, nprocs=2, quiet=True)
    for rank, got in enumerate(res):
        g = torch.Generator().manual_seed(rank)
        assert len(got) == 402
        for i in range(400):
            t = got[f"model.layers.{i}.self_attn.q_proj.lora_A.weight"]
            dt = (torch.float32, torch.bfloat16, torch.float16)[i % 3]
            assert t.dtype == dt and torch.equal(t, torch.randn(8, 64, generator=g).to(dt)), i
        a, b = got["views"]
        assert torch.equal(torch.cat([a, b.flatten()]), torch.arange(4 * 64, dtype=torch.float32))
        f8 = torch.linspace(-4, 4, 64).to(torch.float8_e4m3fn)
        assert got["float8"].dtype == f8.dtype and torch.equal(got["float8"].view(torch.uint8), f8.view(torch.uint8))

def test_dtensor_result_is_refused(tmp_path, monkeypatch):
    # a DTensor came back tied to the job's mesh, whose process group had ended with the ranks: a shard of nothing
    (tmp_path/"lfk_many_cases.py").write_text(MANY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import lfk_many_cases
    from lora_fsdp_kit.launch import LaunchError, launch
    with pytest.raises(LaunchError, match=r"a DTensor cannot be returned from a rank: return t.full_tensor\(\)"):
        launch(lfk_many_cases.dtensor, nprocs=2, quiet=True)

PLUG = '''
from lora_fsdp_kit.platform import CpuPlatform, PlatformRegistry
@PlatformRegistry.register("lfkplugcpu")
class PlugCpu(CpuPlatform): pass
def rank_platform():
    from lora_fsdp_kit.platform import get_platform
    return get_platform().name
'''

def test_a_platform_pinned_in_code_reaches_the_ranks(tmp_path, monkeypatch):
    # a plugin loaded in code (`load_plugins(env=...)`) and its platform pinned (`set_platform`): the ranks detected
    # their own (here the CPU; on a GPU machine, CUDA where the user had pinned another)
    (tmp_path/"lfk_plug_cases.py").write_text(PLUG)
    monkeypatch.syspath_prepend(str(tmp_path))
    from lora_fsdp_kit import platform as P
    from lora_fsdp_kit.launch import launch
    P.load_plugins(env="lfk_plug_cases", entry_points=False); P.set_platform("lfkplugcpu")
    try:
        import lfk_plug_cases
        assert launch(lfk_plug_cases.rank_platform, nprocs=2, quiet=True) == ["lfkplugcpu"] * 2
    finally:
        P.reset_platform(); P.PlatformRegistry.unregister("lfkplugcpu"); P._loaded_plugins.pop("lfk_plug_cases", None)

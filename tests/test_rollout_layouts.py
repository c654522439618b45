"""The layouts RL users run, as the scripts in `examples/` run them, against a real engine (vLLM's CPU build):
the engine on rank 0 of a torchrun job beside the FSDP group (or an engine on every rank), and a separate engine process
the trainer pushes to.
Each trains 3 versions under FSDP2 on 2 ranks and certifies every one (the engine's copy, the buffers its LoRA kernels
read, and its logprobs against the trainer's own). Runs where vLLM is installed (`make test-vllm`). The layout refused
(an engine core in rank 0's own process, `--in-process`) is refused before vLLM is imported: the main suite tests that
on 2 real ranks (`13a_rollout_vllm`)."""
import json, os, socket, subprocess, sys, time
from pathlib import Path

import pytest

try: import vllm  # noqa: F401
except ImportError:
    if os.environ.get("LFK_REQUIRE_VLLM") == "1": raise       # `make test-vllm` sets it: a skip would hide a failure
    pytest.skip("vllm is not installed here; `make test-vllm` runs these tests in its own environment",
                allow_module_level=True)

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
ENV.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)    # each script chooses where its engine core runs

def versions(out:str)->list[dict]:
    "The JSON line each script prints per version."
    return [json.loads(l) for l in out.splitlines() if l.startswith("{")]

def check(rows:list[dict], out:str, ranks=(0,)):
    seen = sorted((r["version"], r.get("rank", 0)) for r in rows)
    assert seen == [(v, r) for v in range(3) for r in ranks], out[-3000:]
    for r in rows:   # every version certified: copy, kernel buffers, and logprobs against the trainer's
        assert (r["tensors"], r["workers"], r["layers"], r["probes"]) == (16, 1, 10, 36), r
        assert r["max_weight_diff"] < 1e-6 and r["max_logprob_diff"] < 1e-3 and len(r["rollout"]) == 6, r

def _free_port()->int:
    with socket.socket() as s: s.bind(("127.0.0.1", 0)); return s.getsockname()[1]

def _start(*args:str)->subprocess.Popen:
    return subprocess.Popen(list(args), cwd=ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

@pytest.fixture(scope="module")
def jobs():
    "Every layout's scripts, started at once: mostly imports and engine start-ups, they overlap on 2 cores."
    port, t0 = str(_free_port()), time.monotonic()
    procs = {"colocated": _start(*TORCHRUN, "examples/rollout_colocated.py", "--versions", "3"),
             "per_rank": _start(*TORCHRUN, "examples/rollout_colocated.py", "--versions", "3", "--engine-per-rank"),
             "server": _start(sys.executable, "examples/rollout_server.py", "serve", "--port", port),
             "trainer": _start(*TORCHRUN, "examples/rollout_server.py", "train", "--port", port, "--versions", "3")}
    done = {}
    def result(name:str)->tuple[int, str, float]:
        "(exit status, output, seconds from the start) of one script."
        if name not in done:
            out = procs[name].communicate(timeout=300)[0]
            done[name] = procs[name].returncode, out, time.monotonic() - t0
        return done[name]
    yield result
    for p in procs.values():
        if p.poll() is None: p.kill(); p.wait()

def test_colocated_engine_on_rank_0(jobs):
    rc, out, _ = jobs("colocated")
    assert rc == 0, out[-3000:]
    check(versions(out), out)

def test_colocated_engine_on_every_rank(jobs):
    "An engine in each rank's own process (vLLM's external_launcher), each pushed and certified the whole adapter."
    rc, out, _ = jobs("per_rank")
    assert rc == 0, out[-3000:]
    check(versions(out), out, ranks=(0, 1))

def test_a_separate_engine_process(jobs):
    rc, out, _ = jobs("trainer")
    src, served, _ = jobs("server")                 # it stops when the trainer says so
    assert rc == 0 and src == 0, out[-2000:] + served[-2000:]
    assert "serving on port" in served
    check(versions(out), out)

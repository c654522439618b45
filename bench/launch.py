"""Wall time of the kit's launcher, and its reliability under load.

Timing: an empty 2-rank launch (spawn, init, destroy) and a 2-rank all_reduce of 64 MiB.
Stress (`--stress N`): N rounds of the launches that used to fail on a loaded machine (a function without any
collective on 2 and 3 ranks, whose ranks leave at once, and a 2-rank all_reduce), with `--burners` busy-looping
processes beside them; prints the pass count and every failure.

Run: .venv/bin/python bench/launch.py [--repeat 3]
     .venv/bin/python bench/launch.py --stress 30 --burners 2
"""
import argparse, os, statistics, subprocess, sys, time
from lora_fsdp_kit.launch import launch, smoke, LaunchError

def timed(fn, *args, repeat=3, **kw):
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter(); out = launch(fn, *args, quiet=True, **kw); ts.append(time.perf_counter() - t0)
    return ts, out

def stress(rounds:int, burners:int):
    "Run `rounds` rounds of three launches beside `burners` CPU burners; print how many rounds passed."
    burn = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(burners)]
    ok, fails, t0 = 0, [], time.perf_counter()
    try:
        for i in range(rounds):
            try:
                assert launch(os.getpid, nprocs=2, quiet=True, timeout=120) is not None
                assert len(launch(os.getpid, nprocs=3, quiet=True, timeout=120)) == 3
                assert all(r["sum"] == r["expected"] for r in launch(smoke, nprocs=2, quiet=True, timeout=120))
                ok += 1
            except (LaunchError, AssertionError) as e: fails.append(f"round {i}: {str(e)[:300]}")
            print(f"round {i + 1}/{rounds}: {ok} passed, {time.perf_counter() - t0:.0f} s", flush=True)
    finally:
        for b in burn: b.kill(); b.wait()
    print(f"stress: {ok}/{rounds} rounds passed (3 launches each: 2 and 3 ranks without collectives, "
          f"2-rank all_reduce) beside {burners} CPU burners, load average {os.getloadavg()[0]:.1f}, {time.perf_counter() - t0:.0f} s")
    for f in fails: print(f)

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--stress", type=int, default=0, help="rounds of the stress test (0: timing only)")
    ap.add_argument("--burners", type=int, default=2, help="CPU-burning processes beside the stress test")
    a = ap.parse_args()
    if a.stress: stress(a.stress, a.burners); sys.exit(0)
    empty, _ = timed(os.getpid, repeat=a.repeat)             # os.getpid: importable, does nothing
    tiny, _ = timed(smoke, 4, repeat=a.repeat)
    big, res = timed(smoke, 16 * 2**20, repeat=a.repeat)     # 16 Mi float32 = 64 MiB
    assert all(r["sum"] == r["expected"] for r in res)
    med = statistics.median
    inside = max(r["seconds"] for r in res)   # timed inside the ranks, after a barrier: the collective alone
    print(f"empty 2-rank launch (spawn, init, destroy):  median {med(empty):.2f} s  (runs: {', '.join(f'{t:.2f}' for t in empty)})")
    print(f"2-rank launch with an all_reduce of 16 B:     median {med(tiny):.2f} s")
    print(f"2-rank launch with an all_reduce of 64 MiB:   median {med(big):.2f} s  "
          f"(the all_reduce itself, timed in the ranks: {inside * 1e3:.0f} ms = {64 / 2**10 / inside:.2f} GiB/s)")

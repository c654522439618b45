"""Wall time of the kit's launcher: an empty 2-rank launch (spawn, init, destroy) and a 2-rank all_reduce of 64 MiB.

Run: .venv/bin/python bench/launch.py [--repeat 3]
"""
import argparse, os, statistics, time
from lora_fsdp_kit.launch import launch, smoke

def timed(fn, *args, repeat=3, **kw):
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter(); out = launch(fn, *args, quiet=True, **kw); ts.append(time.perf_counter() - t0)
    return ts, out

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--repeat", type=int, default=3); a = ap.parse_args()
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

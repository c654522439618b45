"""What `lfk fits --max-batch` / `--max-seq` costs, in traces: per setting of fits' default sweep, one trace's time
(every rank's, and rank 0's alone: the search's guide) beside the search's time and its traces, now (`fits`' own
`_search`) and as it was before (every value traced for every rank, from batch 1), side by side in one run.

    OMP_NUM_THREADS=1 LFK_TRACE_FORK=0 .venv/bin/python bench/fits_search.py [--max-seq] [--settings N | --setting I]
        [--no-before]

The model is the Llama-3-8B shape (config only, on the meta device) at world 8 on 80 GiB devices, as in issue 50. The
search now runs first, so the one before meets the trace's caches warm (in its favour). Traces: every rank's + rank 0's
alone (FSDP1 with use_orig_params traces 3 ranks at world 8, so rank 0's is a third of a value's; FSDP2's rank 0 is
every rank's). Both searches give the same answer (checked).

--max-batch, 2026-12-07 01:02-01:31 UTC, 2 cores at load 13-22 (3 other sessions' work), OMP_NUM_THREADS=1,
LFK_TRACE_FORK=0; "now" before `_plan_of` (a setting's plan made once) and `_aim`'s bracket ends for adjacent peaks:

    setting                   trace rank 0    before       now         answer (now: values traced)
    fsdp2:layer bf16          12.2s  11.8s     80.0s 4+0    45.5s 2+2   24 (2, 3, 24, 25)
    fsdp2:layer bf16 ac       59.4s  22.6s    175.5s 5+0   183.5s 2+3   79 (2, 3, 96, 79, 80)
    fsdp1:layer orig bf16     82.1s  47.0s    295.9s 5+0   232.2s 2+2   19 (2, 3, 19, 20)
    fsdp1:layer orig bf16 ac  44.7s  23.0s    316.4s 5+0   322.0s 4+3   79 (2, 3, 96, 78, 79, 87, 80)
    every setting: before 867.8 s, now 783.2 s

With CPU time (`--setting 2`, 01:37-01:43 UTC, load 8.5-11; `--setting 3`, 01:43-01:50, load 5.5-6; CPU-s of this
process; the search as it is now but for the bracket ends, which leave the second row's values as they are):

    setting                   trace rank 0               before                  now  answer (now: values traced)
    fsdp1:layer orig bf16     29.4s  12.0s        97s 41cpu 5+0        77s 24cpu 2+2  19 (2, 3, 19, 20)
    fsdp1:layer orig bf16 ac  18.7s   8.8s        88s 49cpu 5+0        84s 51cpu 4+3  79 (2, 3, 96, 78, 79, 87, 80)

In rank traces (each 2 steps of 4 and 5 decoder layers): before 4 + 5 + 15 + 15 = 39, now 4 + 5 + 8 + 15 = 32: the
guide's values are rank 0's, a value that decides is traced for every rank. Under checkpointing the peaks climb in
steps (78 and 79 fit, 80 does not, the line through them aims at 87), and FSDP1's search costs what it did. One rank's
trace is 1.7-3 CPU-s (FSDP2, FSDP1; measured at the same load), 6-25 s wall at this load: the 60 s of issue 50 needs
a machine far less loaded than this one was.

--max-seq, 01:25-01:31 UTC, load 9-15: FSDP2 before 60 s (21 CPU-s, 7 values), now 243 s (29 CPU-s, 5+4: 2, 3, 96, 3072,
13752, 12514, 12642, 13197, 12643; answer 12642); FSDP2 with checkpointing before: fails at seq 1 (the trace's
recompute: a checkpoint metadata mismatch), now starts at 2. The seq's peaks bend: the line misses more often.
"""
import argparse, json, os, sys, tempfile, time

import lora_fsdp_kit.fits.core as core, lora_fsdp_kit.fits.report as report
from lora_fsdp_kit.__main__ import fits_job_of_args, parser
from lora_fsdp_kit.fits.report import _cap, _fits_model, _search
from lora_fsdp_kit.units import parse_bytes

LLAMA3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, torch_dtype="bfloat16")

def before(peak, usable:int, cap:int, jump:int=32)->tuple[int, dict]:
    "The search as it was (commit 008ce37): every value's peak traced for every rank, from 1; a line, else halving."
    seen, order = {}, []
    def fits(n):
        if n not in seen: seen[n] = peak(n); order.append(n)
        return seen[n] <= usable
    if not fits(1): return 0, seen
    lo, hi, n, halve = 1, None, 2, False
    while True:
        width = None if hi is None else hi - lo
        if fits(n): lo = n
        else: hi = n
        if hi is not None and hi - lo <= 1: return lo, seen
        if hi is None and lo >= cap: return cap, seen
        if halve: n, halve = (lo + hi) // 2, False; continue
        halve = width is not None and hi - lo > width / 2
        a, b = sorted(order[-2:])
        slope = (seen[b] - seen[a]) / (b - a)
        top = min(cap, jump * lo) if hi is None else hi - 1
        n = max(lo + 1, min(a + int((usable - seen[a]) // slope) if slope > 0 else top, top))

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-seq", action="store_true",
                    help="search the sequence (at batch 1), not the batch (at seq 512)")
    ap.add_argument("--settings", type=int, default=None, help="only the first N settings of the sweep")
    ap.add_argument("--setting", type=int, action="append", help="only setting I of the sweep (0-3; repeatable)")
    ap.add_argument("--no-before", action="store_true", help="the search as it is now, alone")
    b = ap.parse_args()
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f: json.dump(LLAMA3_8B, f)
    a = parser().parse_args(["fits", "--config", d, "--world", "8", "--device-memory", "80GiB"])
    a.argv = []
    job, wraps = fits_job_of_args(a)   # fits' default sweep: FSDP2, FSDP1 x checkpointing off, on; bf16 compute
    model = _fits_model(d, job.lora_r, ",".join(job.lora_targets))
    usable, search = parse_bytes("80GiB") - parse_bytes("2GiB"), "seq" if b.max_seq else "batch"
    size = lambda n: (n, 512) if search == "batch" else (1, n)
    calls = []   # (rank or None: every rank, seconds) of each prediction
    def timed(*args, **kw):
        t = time.perf_counter(); m = probe(*args, **kw)
        calls.append((args[10] if len(args) > 10 else kw.get("rank"), time.perf_counter() - t)); return m
    probe, report._probe = report._probe, timed
    print(f"Llama-3-8B shape, world 8, 80 GiB less 2 GiB reserve, --max-{search}; load {os.getloadavg()[0]:.1f}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, LFK_TRACE_FORK={os.environ.get('LFK_TRACE_FORK')}")
    print(f"{'setting':<24}{'trace':>7}{'rank 0':>7}  {'before':>19}  {'now':>19}  answer (now: values traced)")
    total, cpus = [0.0, 0.0], [0.0, 0.0]   # wall and CPU seconds: before, now
    for c in [w for i, w in enumerate(wraps[:b.settings]) if b.setting is None or i in b.setting]:
        name = c.label.replace("mixed_precision=", "")
        calls.clear(); t0, c0 = time.perf_counter(), time.process_time()
        try: best, seen, _ = _search(model, c, 8, 1, 512, "config", "base", "nccl", "auto", None, usable, search)
        except Exception as e: print(f"{name:<24} refused: {str(e)[:60]}"); continue
        now, cpu, got = time.perf_counter() - t0, time.process_time() - c0, list(calls)
        full = [s for r, s in got if r is None]; guide = [s for r, s in got if r is not None]
        if not full: full = [timed(model, c, 8, *size(2), "config", "base", "nccl", "auto") and calls[-1][1]]
        if not guide: guide = [timed(model, c, 8, *size(2), "config", "base", "nccl", "auto", None, 0) and calls[-1][1]]
        old = "-"
        if not b.no_before:
            calls.clear(); t0, c0 = time.perf_counter(), time.process_time()
            def peak(n):   # as before: the plan made again for each value
                core._PLANS.clear(); return timed(model, c, 8, *size(n), "config", "base", "nccl", "auto").worst_case
            try: ob, oseen = before(peak, usable, _cap(model, search))
            except Exception as e:   # seq 1 under checkpointing: the trace's recompute fails (now: starts at 2)
                print(f"{name:<24} before: fails: {type(e).__name__}: {str(e).splitlines()[0][:50]}")
                ob, oseen = best, {}
            took, ocpu = time.perf_counter() - t0, time.process_time() - c0; total[0] += took; cpus[0] += ocpu
            assert ob == best, (ob, best)   # the same answer (or it failed)
            old = f"{took:.0f}s {ocpu:.0f}cpu {len(oseen)}+0"
        total[1] += now; cpus[1] += cpu
        new = f"{now:.0f}s {cpu:.0f}cpu {len(full)}+{len(guide)}"
        print(f"{name:<24}{full[0]:>6.1f}s{guide[0]:>6.1f}s  {old:>19}  {new:>19}  "
              f"{best} ({', '.join(map(str, seen))})", flush=True)
    print(f"every setting: before {total[0]:.0f} s ({cpus[0]:.0f} CPU-s), now {total[1]:.0f} s ({cpus[1]:.0f} CPU-s); "
          f"load {os.getloadavg()[0]:.1f}")

if __name__ == "__main__": sys.exit(main())

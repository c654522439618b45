"""What `lfk fits --max-batch` / `--max-seq` costs, in traces: per setting of fits' default sweep, one trace's time
(every rank's, and rank 0's alone: the search's guide) beside the search's time and its traces, now (`fits`' own
`search_setting`) and as it was before (commit 8dfa587: a line through the peaks, the value after the answer traced
for every rank), side by side in one process; then, with `--cli`, the real command (its settings side by side in
forked copies).

    OMP_NUM_THREADS=1 LFK_TRACE_FORK=0 .venv/bin/python bench/fits_search.py [--max-seq] [--setting I ...]
        [--no-before] [--cli]

The model is the Llama-3-8B shape (config only, on the meta device) at world 8 on 80 GiB devices, as in issue 50.
Values traced: every rank's + rank 0's alone (FSDP1 with use_orig_params traces 3 ranks at world 8, so rank 0's is a
third of a value's; FSDP2's rank 0 is every rank's). Both searches give the same answer (checked). The search now runs
first, so the one before meets the trace's caches warm (in its favour).

--max-batch, 2026-12-07 03:47-03:54 UTC, 2 cores at load 4.0-4.7 (3 other sessions' work), OMP_NUM_THREADS=1,
LFK_TRACE_FORK=0; "before": the search of this morning (below), "now": profiles to aim, the guide's "no" decides,
settings side by side (the CLI only); "trace": batch 2 (this run measured it after the searches, the search now
first and cold: FSDP2's 13 s hold ~3 s of the process's first trace):

    setting                   trace rank 0             before                now  answer (now: values traced)
    fsdp2:layer bf16           2.0s   1.7s        8s 8cpu 2+2      13s 11cpu 1+3  24 (2', 3', 24, 25')
    fsdp2:layer bf16 ac        4.1s   3.3s      14s 14cpu 2+3      11s 11cpu 1+3  79 (2', 3', 79, 80')
    fsdp1:layer orig bf16     16.2s  14.2s      40s 26cpu 2+2      19s 19cpu 1+3  19 (2', 3', 19, 20'*)
    fsdp1:layer orig bf16 ac  18.0s   4.8s      85s 57cpu 4+3      39s 25cpu 1+3  79 (2', 3', 79, 80'*)
    every setting: before 147 s (105 CPU-s), now 82 s (66 CPU-s)

(': rank 0's trace, every rank's for FSDP2; *: the answer's next value is rank 0's alone, "at 20: 80.24 GiB on rank 0
alone (2.24 GiB missing)": a lower bound, over the device already.) In rank traces (each 2 steps of 4 and 5 decoder
layers): before 4 + 5 + (2 + 6) + (4 + 9) = 30, now 4 + 4 + (3 + 3) + (3 + 3) = 20. Under checkpointing the peak
moves from the forward (batch 2) to the backward (batch 3 on): the peaks' line through 2 and 3 aims at 173 (FSDP2)
and 115 (FSDP1), each op's line (`_profile`) at 79, the answer.

--max-seq, 04:00-04:12 UTC, load 5.2-7.9 (values 2, 3: the guide's; then where the ops' lines aim, the next):

    fsdp2:layer bf16           4.8s   3.8s      60s 25cpu 5+4      16s 11cpu 0+4  12642 (2', 3', 12642', 12643')
    fsdp2:layer bf16 ac       16.1s   6.0s      49s 24cpu 2+5      30s 15cpu 0+4  40632 (2', 3', 40632', 40633')
    fsdp1:layer orig bf16     16.9s   4.9s     137s 49cpu 5+4      25s 17cpu 1+4  9937 (2', 3', 9937', 9937, 9938'*)
    fsdp1:layer orig bf16 ac  21.0s   7.3s     313s 82cpu 5+4      72s 29cpu 1+4  40624 (2', 3', 40624', 40624, 40625'*)
    every setting: before 559 s (179 CPU-s), now 143 s (72 CPU-s)

The real command (`--cli`; `lfk fits --config <this config> --world 8 --device-memory 80GiB --max-batch`), the
settings side by side in forked copies, against the kit of this morning (commit 8dfa587, each trace's steps forked):

    --max-batch   before (8dfa587)                          now
    03:25 UTC     234 s wall, 119 + 13 CPU-s, load 1.9 -> 6.1
    03:54-04:00   242 s wall, 145 + 14 CPU-s, load 4.4 -> 5.0  95 s, 80 + 5 CPU-s, load 4.0 -> 4.5 (`--cli`);
                                                               127 s, 76 + 5 CPU-s, load 5.0 -> 5.4
    04:22         beside `pytest -q tests/test_fits.py`:       219 s, 81 + 6 CPU-s, load 5.2 -> 7.0
    04:33         (the other sessions quieter)                 41 s, 65 + 5 CPU-s, load 2.9 -> 2.5
    04:34         beside `pytest -q tests/test_fits.py`:       64 s, 65 + 5 CPU-s, load 2.2 -> 2.9
    --max-seq
    04:14-04:22   322 s wall, 201 + 22 CPU-s, load 4.7 -> 5.0  73 s, 70 + 5 CPU-s, load 7.9 -> 4.7 (`--cli`);
                                                               124 s, 84 + 6 CPU-s, load 5.0 -> 5.5
    04:26         beside `pytest -q tests/test_fits.py`:       243 s, 92 + 7 CPU-s, load 6.4 -> 9.2
    04:35         (the other sessions quieter)                 48 s, 64 + 5 CPU-s, load 2.9 -> 2.4
    04:36         beside `pytest -q tests/test_fits.py`:       83 s, 70 + 5 CPU-s, load 2.2 -> 3.3

The same answers (every row's value and peak, to the byte; the value after the answer is rank 0's alone where FSDP1
traces 3 ranks, and here the same bytes as every rank's). The command takes about half the CPU (batch 159 -> 70-87
CPU-s, seq 223 -> 69-99), and its wall time follows the CPU it gets: 41-48 s at load 2.5-2.9, 64-83 s beside a
test file (4 settings' copies on 2 cores, balanced: 39 + 16 s and 30 + 22 s of tracing, 5 CPU-s of imports and the
model before them). Issue 50's 60 s beside a test run needs fewer traces still: 20 rank traces of 2.5-3 CPU-s each
(with --max-seq, FSDP1 traces rank 0 at the answer twice: its guide, then every rank).

Each trace's own cost, 2026-12-07 06:20-07:13 UTC (issue 50 item 2). A probe (rank 0's 2 reduced traces) at load ~2,
in one process, timed by phase: train_step 1.1-1.9 CPU-s (torch's fake dispatch and trackers: ~75 %), _sharded 0.3,
the GC collection after the trace 0.13, one full collection in every few probes 0.3 (the reduced traces combined with
the collector back on), _prime 0.1-0.4. Cut (`fits_trace`, the same bytes): FSDP1's param_init_fn made its empty
tensors with torch.empty (empty_like of a meta tensor under fake mode converts it to a fake one first: wrap 0.25 ->
0.17 CPU-s a probe); the reduced traces combined inside the GC pause, the trace's op keys handed over and freed before
the collection (~125,000 -> ~88,000 objects walked; GC 3.4 -> 1.6 CPU-s over 9 probes). Tried, dropped: AdamW's
foreach loop for the priming step (the same state, but FSDP2's recorded step then ran other ops: the same peaks, not
the same timeline; test_fits_accuracy's primed-step test caught it). Before/after, one probe each, back to back:

    probe (rank 0, seq ~4000)      before (2 x 2 runs)   after (2 x 2 runs)
    fsdp1:layer orig bf16          2.36-2.65 CPU-s       2.01-2.29 CPU-s
    fsdp2:layer bf16               2.06-2.35             1.71-2.01

The command, the kit before (commit HEAD's fits) and after, back to back, each a fresh process (outputs identical):

    07:10-07:13, other sessions only        before                                 after
    --max-seq                               39 s wall, 44 + 4 CPU-s, load 3.2->3.1  46 s, 42 + 3 CPU-s, load 3.1->3.7
    --max-batch                             66 s, 54 + 4 CPU-s, load 4.1->4.2       51 s, 48 + 4 CPU-s, load 3.7->4.1
    07:05-07:09
    --max-seq                               59 s wall, 51 + 3 CPU-s, load 3.9->4.5  53 s, 44 + 4 CPU-s, load 2.5->3.9
    --max-batch                             75 s, 61 + 4 CPU-s, load 4.5->4.8       60 s, 55 + 4 CPU-s, load 4.8->4.4
    06:52-06:58, beside pytest tests/test_fits*.py (it ended ~06:57)
    --max-seq                               64 s, 53 + 4 CPU-s, load 4.4->4.4       96 s, 60 + 4 CPU-s, load 4.4->4.2
    --max-batch                             85 s, 74 + 5 CPU-s, load 4.2->3.6       110 s, 79 + 5 CPU-s, load 4.2->4.2

On 2 shared cores the command's CPU-s moves +-20 % from run to run with the load (SMT and caches shared), more than
this cut (~10-15 % of a probe). Issue 50's 60 s beside a test run is not reached: the rest of a trace is torch's
(FakeTensorMode's cache keys and outputs, MemTracker, FSDP's hooks), one op at a time.
"""
import argparse, json, os, resource, subprocess, sys, tempfile, time

from lora_fsdp_kit.__main__ import fits_job_of_args, parser
from lora_fsdp_kit.fits import search as searching
from lora_fsdp_kit.fits.report import _fits_model
from lora_fsdp_kit.fits.search import every_rank, search_cap, search_setting
from lora_fsdp_kit.units import parse_bytes

LLAMA3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, torch_dtype="bfloat16")

# ---- the search as it was (commit 8dfa587), for the comparison ----
def _line(pts:dict, order:list):
    last = list(dict.fromkeys(reversed(order)))[:2]
    if len(last) < 2: return None
    a, b = sorted(last)
    return a, (pts[b] - pts[a]) / (b - a), b - a

def _aim(seen, order, low, lows, usable, lo, hi, top):
    line, at = _line(seen, order), None
    if line is not None and line[2] == 1 and hi is not None and lo:
        line = lo, ((seen[hi] if hi in seen else low[hi]) - seen[lo]) / (hi - lo), hi - lo
    elif (line is None or line[2] == 1) and (wide := _line(low, lows)) is not None:
        line, at = wide, (order[-1], seen[order[-1]]) if order else (wide[0], low[wide[0]])
    if line is None: return max(lo + 1, (lo + hi) // 2 if hi else lo + 1), True
    (a, slope, _), (a, pa) = line, at or (line[0], seen[line[0]])
    want = a + int((usable - pa) // slope) if slope > 0 else top + 1
    return max(lo + 1, min(want, top)), want <= top

def before_fitting(peak, usable, cap=2**16, jump=32, guide=None):
    "`largest_fitting` as it was: the guide's 'no' not trusted at the end (the next value traced for every rank)."
    seen, order, low, lows = {}, [], {}, []
    def fits(n, exact):
        if n in seen or exact or guide is None:
            if n not in seen: seen[n] = peak(n); order.append(n)
            return seen[n] <= usable
        if n not in low: low[n] = guide(n); lows.append(n)
        return low[n] <= usable
    lo, reach, hi, halve = 0, 0, None, False
    for n in (2, 3)[:max(cap - 1, 0)]:
        if not fits(n, False): hi = n; break
        lo, reach = (n if n in seen else lo), n
    while True:
        if hi is not None and hi - lo <= 1:
            if not fits(hi, True): return lo, {**low, **seen}
            lo = reach = hi; hi = None
        if hi is None and lo >= cap: return cap, {**low, **seen}
        before = None if hi is None else hi - max(lo, reach)
        top = min(cap, jump * max(reach, 1)) if hi is None else hi - 1
        n, aimed = ((max(lo, reach) + hi) // 2, True) if halve else _aim(seen, order, low, lows, usable, lo, hi, top)
        if fits(n, aimed or hi is not None or n in low): lo, reach = (n if n in seen else lo), max(reach, n)
        else: hi, reach = n, min(reach, n - 1)
        halve = not halve and before is not None and hi - max(lo, reach) > before / 2

def before_search(model, c, size, usable, search):
    "`search_setting` as it was: (answer, value -> peak)."
    mems = {}
    def peak(n, rank=None):
        if rank is None and n in mems: return mems[n].worst_case
        m = searching.probe(model, c, 8, *size(n), "config", "base", "nccl", "auto", None, rank)
        if (every := every_rank(m)) is not None: mems[n] = every
        return m.worst_case
    return before_fitting(peak, usable, search_cap(model, search), guide=lambda n: peak(n, 0))

def cli(d:str, search:str)->str:
    "The real command, its settings in forked copies as users run it: wall, CPU-s of the command, load before/after."
    env = {k: v for k, v in os.environ.items() if k != "LFK_TRACE_FORK"}   # copies: one per core
    r0, l0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0], time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "lora_fsdp_kit", "fits", "--config", d, "--world", "8", "--device-memory",
                        "80GiB", f"--max-{search}"], env=env, capture_output=True, text=True)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    found = [l for l in p.stdout.splitlines() if l[:3] in ("1: ", "2: ", "3: ", "4: ")]
    return (f"lfk fits --max-{search}: {wall:.0f} s wall, {r1.ru_utime - r0.ru_utime:.0f} user + "
            f"{r1.ru_stime - r0.ru_stime:.0f} sys CPU-s, exit {p.returncode}, "
            f"load {l0:.1f} -> {os.getloadavg()[0]:.1f}\n"
            + "\n".join(found))

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-seq", action="store_true",
                    help="search the sequence (at batch 1), not the batch (at seq 512)")
    ap.add_argument("--setting", type=int, action="append", help="only setting I of the sweep (0-3; repeatable)")
    ap.add_argument("--no-before", action="store_true", help="the search as it is now, alone")
    ap.add_argument("--cli", action="store_true", help="then the real command, `lfk fits --max-...`, timed")
    b = ap.parse_args()
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f: json.dump(LLAMA3_8B, f)
    a = parser().parse_args(["fits", "--config", d, "--world", "8", "--device-memory", "80GiB"])
    a.argv = []
    job, wraps = fits_job_of_args(a)   # fits' default sweep: FSDP2, FSDP1 x checkpointing off, on; bf16 compute
    model = _fits_model(d, job.lora_r, ",".join(job.lora_targets))
    usable, search = parse_bytes("80GiB") - parse_bytes("2GiB"), "seq" if b.max_seq else "batch"
    size = lambda n: (n, 512) if search == "batch" else (1, n)
    calls = []   # (value, rank or None: every rank, seconds) of each prediction
    def timed(*args, **kw):
        t = time.perf_counter(); m = probe(*args, **kw)
        rank = args[10] if len(args) > 10 else kw.get("rank")
        calls.append((args[3] if search == "batch" else args[4], rank, time.perf_counter() - t)); return m
    probe, searching.probe = searching.probe, timed
    def run(f):
        calls.clear(); t0, c0 = time.perf_counter(), time.process_time()
        out = f()
        return out, time.perf_counter() - t0, time.process_time() - c0, list(calls)
    count = lambda got: f"{sum(r is None for _, r, _ in got)}+{sum(r is not None for _, r, _ in got)}"
    print(f"Llama-3-8B shape, world 8, 80 GiB less 2 GiB reserve, --max-{search}; load {os.getloadavg()[0]:.1f}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, LFK_TRACE_FORK={os.environ.get('LFK_TRACE_FORK')}")
    print(f"{'setting':<24}{'trace':>7}{'rank 0':>7}  {'before':>17}  {'now':>17}  answer (now: values traced)")
    total = [0.0, 0.0, 0.0, 0.0]   # wall and CPU seconds: before, now
    for c in [w for i, w in enumerate(wraps) if b.setting is None or i in b.setting]:
        name = c.label.replace("mixed_precision=", "")
        try:   # first one trace of the setting, every rank's and rank 0's (the caches warm for both searches)
            calls.clear()
            timed(model, c, 8, *size(2), "config", "base", "nccl", "auto")
            timed(model, c, 8, *size(2), "config", "base", "nccl", "auto", None, 0)
            (_, _, full), (_, _, guide) = calls
            (best, seen, lower, _), now, cpu, got = run(lambda: search_setting(
                model, c, 8, 1, 512, "config", "base", "nccl", "auto", None, usable, search))
        except Exception as e: print(f"{name:<24} refused: {str(e)[:60]}"); continue
        total[2] += now; total[3] += cpu
        old = "-"
        if not b.no_before:
            try: (ob, oseen), took, ocpu, ogot = run(lambda: before_search(model, c, size, usable, search))
            except Exception as e:
                print(f"{name:<24} before: fails: {type(e).__name__}: {str(e).splitlines()[0][:50]}"); continue
            assert ob == best, (ob, best)   # the same answer
            total[0] += took; total[1] += ocpu
            old = f"{took:.0f}s {ocpu:.0f}cpu {count(ogot)}"
        shown = ", ".join(f"{n}{'' if r is None else chr(39)}{'*' if n in lower else ''}" for n, r, _ in got)
        print(f"{name:<24}{full:>6.1f}s{guide:>6.1f}s  {old:>17}  {f'{now:.0f}s {cpu:.0f}cpu {count(got)}':>17}  "
              f"{best} ({shown})", flush=True)
    print(f"every setting: before {total[0]:.0f} s ({total[1]:.0f} CPU-s), "
          f"now {total[2]:.0f} s ({total[3]:.0f} CPU-s); "
          f"load {os.getloadavg()[0]:.1f}; values in the order traced, ': rank 0's trace, *: the answer's bound")
    if b.cli: print(cli(d, search))

if __name__ == "__main__": sys.exit(main())

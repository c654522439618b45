"""What `lfk fits --max-batch` / `--max-seq` costs, in traces: per setting of fits' default sweep, one trace's time
beside the search's time and its number of traces (each a full step trace of `predict_step_memory`).

    OMP_NUM_THREADS=1 LFK_TRACE_FORK=0 .venv/bin/python bench/fits_search.py [--max-seq] [--jump 8]

The model is the Llama-3-8B shape (config only, on the meta device) at world 8 on 80 GiB devices, as in issue 50;
`--jump 8` runs the search as it was before (at most x8 a step before a value that does not fit is known)."""
import argparse, json, os, statistics, sys, tempfile, time

from lora_fsdp_kit.__main__ import fits_job_of_args, parser
from lora_fsdp_kit.fits.report import _cap, _fits_model, _probe, largest_fitting
from lora_fsdp_kit.units import parse_bytes

LLAMA3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, torch_dtype="bfloat16")

def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-seq", action="store_true",
                    help="search the sequence (at batch 1), not the batch (at seq 512)")
    ap.add_argument("--jump", type=int, default=None, help="largest_fitting's jump (default: its own)")
    ap.add_argument("--settings", type=int, default=None, help="only the first N settings of the sweep")
    b = ap.parse_args()
    d = tempfile.mkdtemp()
    with open(os.path.join(d, "config.json"), "w") as f: json.dump(LLAMA3_8B, f)
    a = parser().parse_args(["fits", "--config", d, "--world", "8", "--device-memory", "80GiB"])
    a.argv = []
    job, wraps = fits_job_of_args(a)   # fits' default sweep: FSDP2, FSDP1 x checkpointing off, on; bf16 compute
    model = _fits_model(d, job.lora_r, ",".join(job.lora_targets))
    usable, search = parse_bytes("80GiB") - parse_bytes("2GiB"), "seq" if b.max_seq else "batch"
    kw = {} if b.jump is None else dict(jump=b.jump)
    print(f"Llama-3-8B shape, world 8, 80 GiB less 2 GiB reserve, --max-{search}; load {os.getloadavg()[0]:.1f}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, LFK_TRACE_FORK={os.environ.get('LFK_TRACE_FORK')}")
    print(f"{'setting':<28}{'one trace':>11}{'median':>9}{'search':>9}{'traces':>8}  answer (values traced)")
    total = 0.0
    for c in wraps[:b.settings]:
        times = []
        def peak(n):
            t = time.perf_counter()
            m = _probe(model, c, 8, *((n, 512) if search == "batch" else (1, n)), "config", "base", "nccl", "auto")
            times.append(time.perf_counter() - t); return m.worst_case
        t0 = time.perf_counter()
        try: best, seen = largest_fitting(peak, usable, _cap(model, search), **kw)
        except Exception as e: print(f"{c.label:<28} refused: {str(e)[:60]}"); continue
        took = time.perf_counter() - t0; total += took
        print(f"{c.label.replace('mixed_precision=', ''):<28}{times[0]:>10.1f}s{statistics.median(times):>8.1f}s"
              f"{took:>8.1f}s{len(seen):>8}  {best} ({', '.join(map(str, seen))})", flush=True)
    print(f"every setting: {total:.1f} s")

if __name__ == "__main__": sys.exit(main())

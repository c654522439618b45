"""Bench: the adapter's trip from FSDP ranks into a real vLLM engine (`lora_fsdp_kit.rollout.core`), against its limit.

For each model (the rollout chapter's 2-layer Llama, hidden 128, and a 24-layer Llama, hidden 256; LoRA r=8 on
q/k/v/o) and each FSDP flavour, on 2 gloo ranks, it times as the median of `--runs` runs:
- the kit's trip: the adapter streamed to rank 0 in buckets (`iter_lora_buckets`, bucket size from `bucket_bytes`),
  then `push_lora` into the engine (pack, hand over, the engine's build and registration);
- its limit: one raw `all_gather_into_tensor` of the adapter's bytes (each rank's share) plus the engine's own load
  of the same tensors already in its worker (vLLM's `LoRAModel.from_lora_tensors` and `add_adapter`, timed inside
  the worker);
and, on every rank, the trainer's peak extra memory while it streams the adapter and the merged weights in buckets
(`measure_stream`) against the bound (one unit + one bucket + the largest tensor).

With `--llama8b L`, instead: a push and a certificate per version for a Llama-3-8B-shaped adapter (r=16 on every
linear layer: q/k/v/o and gate/up/down, 8B's shapes), against the same tensors saved to a folder and loaded by the
engine from it (TRL's way), on an engine whose L layers have 8B's shapes (all 32 do not fit this machine's memory in
float32: the adapter, and its costs, scale with the layers).
Timings are noisy on a shared machine. Needs vLLM: run it in the vLLM environment (`make .venv-vllm/.lfk-installed`),
e.g. `OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python bench/rollout.py [--runs 9] [--llama8b 2]`.
"""
from __future__ import annotations

import argparse, os, statistics, tempfile, time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch
import torch.distributed as dist

from lora_fsdp_kit.rollout import core as R, vllm as V; from lora_fsdp_kit.testing import rollout_runs as RR
from lora_fsdp_kit.units import fmt_bytes
from lora_fsdp_kit.launch import launch

MODELS = {"chapter": dict(RR.CHAPTER_CONFIG),
          "llama24": dict(hidden_size=256, intermediate_size=512, head_dim=32, num_attention_heads=8,
                          num_key_value_heads=4, num_hidden_layers=24)}

def build(name:str, folder:str|None=None):
    "The model `name` with LoRA r=8 on q/k/v/o; with `folder`, its base saved there for the engine."
    from lora_fsdp_kit.models import add_lora, model_from_config
    from lora_fsdp_kit.config_files import shipped_config
    cfg = {**shipped_config("llama"), **MODELS[name]}
    if folder: model_from_config(cfg, device="cpu", seed=0).save_pretrained(folder)
    return add_lora(model_from_config(cfg, device="cpu", seed=0), r=8, alpha=16)

def _median_s(fn, runs:int)->float:
    "The slowest rank's median time of `fn` over `runs` runs after a warm-up."
    times = []
    for _ in range(runs + 1):
        dist.barrier(); t0 = time.perf_counter(); fn(); t = torch.tensor(time.perf_counter() - t0)
        dist.all_reduce(t, op=dist.ReduceOp.MAX); times.append(t.item())
    return statistics.median(times[1:])

def trainer_side(name:str, flavour:str, runs:int)->dict|None:
    "Rank code: wrap, one step, then time the kit's stream and one raw all-gather of the adapter's bytes."
    from lora_fsdp_kit.export.core import iter_lora_buckets
    from lora_fsdp_kit.export.measure_streams import measure_stream
    from lora_fsdp_kit.plan.wrap import WrapConfig
    pm = build(name)
    size = R.bucket_bytes(pm)
    model = WrapConfig(flavour=flavour, policy="peft" if flavour == "fsdp1" else "layer").wrap(pm)
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(dist.get_rank()))
    model(input_ids=ids, labels=ids).loss.backward()
    world, rank = dist.get_world_size(), dist.get_rank()
    stream = lambda: [p for b in iter_lora_buckets(model, bucket_bytes=size, rank0_only=True) for p in b]
    adapter = dict(stream())
    nbytes = torch.tensor(sum(t.numel() * t.element_size() for t in adapter.values()) if rank == 0 else 0)
    dist.broadcast(nbytes, 0)
    share = -(-int(nbytes) // world)
    send, recv = torch.zeros(share, dtype=torch.uint8), torch.empty(share * world, dtype=torch.uint8)
    raw_s = _median_s(lambda: dist.all_gather_into_tensor(recv, send), runs)
    gather_s = _median_s(stream, runs)
    profiles = {what: measure_stream(model, size, what=what) for what in ("lora", "merged")}
    peaks = [None] * world
    dist.all_gather_object(peaks, {w: (p.peak_extra, p.bound) for w, p in profiles.items()})
    if rank: return None
    return dict(adapter=adapter, bytes=int(nbytes), raw_s=raw_s, gather_s=gather_s, bucket=size, peaks=peaks)

def _engine_load(worker, data:bytes, cfg:dict, runs:int)->float:
    "Inside the worker: median seconds of vLLM's own build and registration of tensors already there."
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    wm = worker.model_runner.lora_manager
    am, times = wm._adapter_manager, []
    helper = PEFTHelper.from_dict({**cfg, "vllm_max_position_embeddings": wm.max_position_embeddings})
    for _ in range(runs + 1):
        tensors = R.unpack(data)
        t0 = time.perf_counter()
        lora = LoRAModel.from_lora_tensors(lora_model_id=999, tensors=tensors, peft_helper=helper, device="cpu",
                                           dtype=wm.lora_config.lora_dtype, model_vocab_size=wm.vocab_size)
        am.add_adapter(lora)
        times.append(time.perf_counter() - t0)
        am.remove_adapter(999)
    return statistics.median(times[1:])

def engine_side(llm, res:dict, peft_config, runs:int)->tuple[float, float]:
    "(median push_lora seconds, median engine-load seconds) for the adapter in `res`."
    times = []
    for _ in range(runs + 1):
        t0 = time.perf_counter(); R.push_lora(llm, res["adapter"], peft_config, name="bench")
        times.append(time.perf_counter() - t0)
    load = llm.collective_rpc(_engine_load, args=(R.pack(res["adapter"]), R.lora_config_dict(peft_config), runs))[0]
    return statistics.median(times[1:]), load

def main(models:list[str], flavours:list[str], runs:int):
    with V.quiet(): from vllm import LLM
    print(f"{'model':8} {'flavour':6} {'adapter':>9} {'raw ms':>7} {'load ms':>7} {'limit':>7} {'gather':>7} "
          f"{'push':>7} {'kit ms':>7} {'x limit':>7}   trainer peak / bound (lora; merged), bucket")
    for name in models:
        folder = tempfile.mkdtemp()
        peft_config = build(name, folder).peft_config["default"]
        with V.quiet():
            llm = LLM(**V.engine_args(folder, max_model_len=128, block_size=32, max_loras=1, max_cpu_loras=2))
        for flavour in flavours:
            res = launch(trainer_side, name, flavour, runs, quiet=True)[0]
            push_s, load_s = engine_side(llm, res, peft_config, runs)
            limit, kit = res["raw_s"] + load_s, res["gather_s"] + push_s
            peaks = "; ".join(", ".join(f"{fmt_bytes(p[w][0])}/{fmt_bytes(p[w][1])}" for w in ("lora", "merged"))
                              for p in res["peaks"])
            print(f"{name:8} {flavour:6} {fmt_bytes(res['bytes']):>9} {res['raw_s']*1e3:7.2f} {load_s*1e3:7.2f} "
                  f"{limit*1e3:7.2f} {res['gather_s']*1e3:7.2f} {push_s*1e3:7.2f} {kit*1e3:7.2f} "
                  f"{kit/limit:7.1f}   {peaks}, {fmt_bytes(res['bucket'])}", flush=True)
        del llm

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

def _timed(fn)->tuple[float, object]:
    t0 = time.perf_counter(); out = fn(); return time.perf_counter() - t0, out

def llama8b(layers:int, runs:int):
    "Per version: push + certify of an 8B-shaped adapter, against saving it to a folder and loading that (TRL)."
    import gc, json
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file
    from vllm.lora.request import LoRARequest
    from lora_fsdp_kit.models import add_lora, model_from_config
    from lora_fsdp_kit.config_files import shipped_config
    folder = tempfile.mkdtemp()
    cfg = {**shipped_config("llama"), **LLAMA3_8B, "num_hidden_layers": layers}
    base = model_from_config(cfg, device="cpu", seed=0)
    base.save_pretrained(folder)                  # the engine's model: 8B's layer shapes
    pm = add_lora(base, r=16, alpha=32, target_modules=ALL_LINEAR)
    sd, peft_config = get_peft_model_state_dict(pm), pm.peft_config["default"]
    del pm, base; gc.collect()
    with V.quiet():
        from vllm import LLM
        llm = LLM(**V.engine_args(folder, max_lora_rank=16, max_model_len=128,
                                  block_size=32, max_loras=1, max_cpu_loras=4))
    probe, rows = list(range(3, 40)), []
    for i in range(runs + 1):   # the first run warms up
        push_s, req = _timed(lambda: R.push_lora(llm, sd, peft_config, name="policy"))
        cert_s, cert = _timed(lambda: R.certify(llm, req, sd))
        score_s, _ = _timed(lambda: V.served_logprobs(llm, req, probe))
        d = tempfile.mkdtemp()
        def save():
            save_file({k: v.contiguous() for k, v in sd.items()}, f"{d}/adapter_model.safetensors")
            with open(f"{d}/adapter_config.json", "w") as f: json.dump(R.lora_config_dict(peft_config), f)
        save_s, _ = _timed(save)
        load_s, _ = _timed(lambda: llm.llm_engine.add_lora(LoRARequest(f"trl{i}", 1000 + i, d)))
        llm.llm_engine.remove_lora(1000 + i)
        rows.append((push_s, cert_s, score_s, save_s, load_s))
    med = [statistics.median(c) * 1e3 for c in zip(*rows[1:])]
    mb = sum(t.numel() * t.element_size() for t in sd.values()) / 2**20
    print(f"Llama-3-8B-shaped adapter, r=16 on every linear layer, {layers} of 32 layers ({len(sd)} tensors, "
          f"{mb:.1f} MiB); median of {runs} versions, ms:")
    print(f"  kit: push_lora {med[0]:.1f} + certify {med[1]:.1f} (copy and kernel buffers, {cert.layers} layers) "
          f"= {med[0] + med[1]:.1f}; a 36-token logprob probe {med[2]:.1f}")
    print(f"  TRL: save to a folder {med[3]:.1f} + the engine's load from it {med[4]:.1f} = {med[3] + med[4]:.1f}")
    llm.llm_engine.engine_core.shutdown()

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--flavours", nargs="+", default=["fsdp1", "fsdp2"], choices=["fsdp1", "fsdp2"])
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--llama8b", type=int, metavar="L", help="the 8B-shaped adapter on an engine of L such layers")
    a = ap.parse_args()
    if a.llama8b: llama8b(a.llama8b, a.runs)
    else: main(a.models, a.flavours, a.runs)

"""Colocated rollout: the engine on rank 0 of a torchrun job, beside the FSDP group that trains the adapter.

    torchrun --standalone --nproc_per_node 2 examples/rollout_colocated.py --versions 3

Each version: FSDP2 train steps on every rank -> `iter_lora_buckets(rank0_only=True)` (every rank takes part, rank 0
gets the whole adapter) -> `push_lora` into rank 0's engine -> `certify` (the engine's copy read back from every worker,
the buffers its LoRA kernels read, and its logprobs against the trainer's own, scored by the FSDP model) -> a rollout.
Rank 1 waits in the next collective.

vLLM's engine core runs in a process of its own (vLLM's default): in rank 0's own process it would build its groups
over the trainer's, a collective rank 1 never enters, and hang; `engine_args` refuses that (`--in-process` shows it).
`--engine-per-rank`: an engine on every rank instead, in the rank's own process (vLLM's `external_launcher`: every
rank builds its engine, so every rank enters vLLM's groups), each pushed and certified the whole adapter.
"""
import argparse, json, os, tempfile, time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB of KV cache on the CPU build; unset: 90 % of RAM
import torch
import torch.distributed as dist

CONFIG = dict(hidden_size=128, intermediate_size=256, head_dim=32, num_attention_heads=4, num_key_value_heads=2)
PROBE = list(range(3, 40))   # token ids scored under teacher forcing, by the trainer and by the engine


def main(versions:int, steps:int, in_process:bool, per_rank:bool=False):
    from lora_fsdp_kit.rollout import core as R
    from lora_fsdp_kit.rollout.vllm import engine_args
    from lora_fsdp_kit.export.core import iter_lora_buckets
    from lora_fsdp_kit.models import add_lora, model_from_config
    from lora_fsdp_kit.config_files import shipped_config
    from lora_fsdp_kit.plan.wrap import WrapConfig

    if in_process: os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    dist.init_process_group("gloo")               # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank, cfg = dist.get_rank(), {**shipped_config("llama"), **CONFIG}
    base = model_from_config(cfg, device="cpu", seed=0)     # the same weights on every rank (seeded)
    llm, folder = None, tempfile.mkdtemp()
    if rank == 0: base.save_pretrained(folder)   # the engine's model (in a real job: the checkpoint's folder)
    if per_rank:                                  # every rank's engine loads rank 0's folder (one machine here)
        folder = [folder]; dist.broadcast_object_list(folder, 0); folder = folder[0]
    if rank == 0 or per_rank:                     # the engine: on rank 0 (or on every rank)
        # vLLM builds its groups over the trainer's ranks: every rank builds its engine (external_launcher), or
        # rank 0's engine core runs in a process of its own (refused in rank 0's process: it would hang)
        over = dict(distributed_executor_backend="external_launcher", seed=rank) if per_rank else {}
        args = engine_args(folder, max_model_len=128, block_size=32, **over)
        from vllm import LLM
        t0 = time.perf_counter()
        llm = LLM(**args)
        print(f"engine up in {time.perf_counter() - t0:.1f} s", flush=True)
    peft = add_lora(base, r=8, alpha=16)
    model = WrapConfig(flavour="fsdp2", policy="layer").wrap(peft)
    size = R.bucket_bytes(model)
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for v in range(versions):
        g = torch.Generator().manual_seed(1000 * v + rank)  # each rank its own batches
        for _ in range(steps):
            ids = torch.randint(0, cfg["vocab_size"], (2, 16), generator=g)
            model(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()
        t0 = time.perf_counter()
        lora = [p for b in iter_lora_buckets(model, bucket_bytes=size, rank0_only=not per_rank) for p in b]
        gather_s = time.perf_counter() - t0
        trained = R.reference_logprobs(model, PROBE)   # the trainer's own logprobs: a forward, every rank
        if rank == 0 or per_rank:
            t0 = time.perf_counter()
            req = R.push_lora(llm, lora, peft.peft_config["default"], name="policy")
            push_s, t0 = time.perf_counter() - t0, time.perf_counter()
            cert = R.certify(llm, req, lora, trained, probe=PROBE)
            certify_s = time.perf_counter() - t0
            from vllm import SamplingParams
            out = llm.generate([{"prompt_token_ids": PROBE[:8]}], SamplingParams(max_tokens=6, temperature=0),
                               lora_request=req, use_tqdm=False)[0].outputs[0].token_ids
            print(json.dumps(dict(version=v, rank=rank, gather_s=gather_s, push_s=push_s, certify_s=certify_s,
                                  rollout=list(out), **vars(cert))), flush=True)
    dist.barrier()                                # every rank has read the last collective's bytes
    if llm is not None: llm.llm_engine.engine_core.shutdown()
    # an engine on every rank takes the trainer's group down with it (vLLM built its own groups on it)
    if dist.is_initialized(): dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per version")
    ap.add_argument("--in-process", action="store_true", help="the engine core in rank 0's process: refused")
    ap.add_argument("--engine-per-rank", action="store_true", help="an engine on every rank (external_launcher)")
    a = ap.parse_args()
    main(a.versions, a.steps, a.in_process, a.engine_per_rank)

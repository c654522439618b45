"""A rollout server: the engine in a process of its own (or on a machine of its own); the trainer pushes to it.

    python examples/rollout_server.py serve --port 29650 &                      # the engine: waits for a trainer
    torchrun --standalone --nproc_per_node 2 examples/rollout_server.py train --port 29650 --versions 3

Each version: FSDP2 train steps on every rank -> `iter_lora_buckets(rank0_only=True)` and the trainer's own logprobs
of a probe (every rank) -> rank 0 sends the adapter as `pack` bytes, with its config and those logprobs, over an
authenticated socket -> the server `push_lora`s it, `certify`s it against the trainer's logprobs, rolls out, and
answers with the certificate and the tokens. The server process holds no process group, so its engine core may run
in it (`VLLM_ENABLE_V1_MULTIPROCESSING=0`, its default here: one process fewer to start).
"""
import argparse, json, os, tempfile, time
from multiprocessing.connection import Client, Listener

import torch

CONFIG = dict(hidden_size=128, intermediate_size=256, head_dim=32, num_attention_heads=4, num_key_value_heads=2)
PROBE = list(range(3, 40))   # token ids scored under teacher forcing, by the trainer and by the engine
KEY = os.environ.get("LFK_ROLLOUT_KEY", "lfk-example").encode()   # the socket's shared secret


def base_model():
    "The base model, the same on the trainer and the server (seeded): in a real job, one checkpoint both load."
    from lora_fsdp_kit.models import model_from_config
    from lora_fsdp_kit.config_files import shipped_config
    return model_from_config({**shipped_config("llama"), **CONFIG}, device="cpu", seed=0)


def serve(port:int):
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB of KV cache on the CPU build; unset: 90 % of RAM
    from lora_fsdp_kit.rollout import core as R
    from lora_fsdp_kit.rollout.vllm import engine_args
    from vllm import LLM, SamplingParams
    folder = tempfile.mkdtemp(); base_model().save_pretrained(folder)
    llm = LLM(**engine_args(folder, max_model_len=128, block_size=32))
    with Listener(("127.0.0.1", port), authkey=KEY) as listener:
        print(f"serving on port {port}", flush=True)
        with listener.accept() as conn:
            while (msg := conn.recv())["op"] != "stop":
                t0 = time.perf_counter()
                lora = R.unpack(msg["adapter"])
                req = R.push_lora(llm, lora, msg["peft_config"], name=msg["name"])
                push_s, t0 = time.perf_counter() - t0, time.perf_counter()
                try: cert = R.certify(llm, req, lora, torch.tensor(msg["trained"]), probe=msg["probe"])
                except R.CertifyError as e:   # the trainer hears why, and stops
                    conn.send({"error": str(e)}); continue
                certify_s = time.perf_counter() - t0
                sp = SamplingParams(max_tokens=6, temperature=0)
                out = llm.generate([{"prompt_token_ids": msg["probe"][:8]}], sp, lora_request=req,
                                   use_tqdm=False)[0].outputs[0].token_ids
                conn.send(dict(push_s=push_s, certify_s=certify_s, rollout=list(out), **vars(cert)))
    llm.llm_engine.engine_core.shutdown()


def connect(port:int, timeout:float=300):
    "A connection to the server, waiting for it to start (its engine takes a while)."
    deadline = time.monotonic() + timeout
    while True:
        try: return Client(("127.0.0.1", port), authkey=KEY)
        except ConnectionRefusedError:
            if time.monotonic() > deadline: raise
            time.sleep(0.5)


def train(port:int, versions:int, steps:int):
    import torch.distributed as dist
    from lora_fsdp_kit.rollout import core as R
    from lora_fsdp_kit.export.core import iter_lora_buckets
    from lora_fsdp_kit.models import add_lora
    from lora_fsdp_kit.plan.wrap import WrapConfig
    dist.init_process_group("gloo")               # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank = dist.get_rank()
    peft = add_lora(base_model(), r=8, alpha=16)
    model = WrapConfig(flavour="fsdp2", policy="layer").wrap(peft)
    size, vocab = R.bucket_bytes(model), peft.config.vocab_size
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    conn = connect(port) if rank == 0 else None
    for v in range(versions):
        g = torch.Generator().manual_seed(1000 * v + rank)  # each rank its own batches
        for _ in range(steps):
            ids = torch.randint(0, vocab, (2, 16), generator=g)
            model(input_ids=ids, labels=ids).loss.backward(); opt.step(); opt.zero_grad()
        lora = [p for b in iter_lora_buckets(model, bucket_bytes=size, rank0_only=True) for p in b]   # collective
        trained = R.reference_logprobs(model, PROBE)   # the trainer's own logprobs: a forward, every rank
        if rank == 0:
            t0 = time.perf_counter()
            conn.send(dict(op="push", name="policy", adapter=R.pack(lora), trained=trained.tolist(), probe=PROBE,
                           peft_config=peft.peft_config["default"].to_dict()))
            res = conn.recv()
            if "error" in res: raise R.CertifyError(f"the server does not serve version {v}: {res['error']}")
            print(json.dumps(dict(version=v, round_trip_s=time.perf_counter() - t0, **res)), flush=True)
    if rank == 0: conn.send(dict(op="stop")); conn.close()
    dist.barrier()                                # every rank has read the last collective's bytes
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("role", choices=["serve", "train"])
    ap.add_argument("--port", type=int, default=29650)
    ap.add_argument("--versions", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per version")
    a = ap.parse_args()
    if a.role == "serve": serve(a.port)
    else: train(a.port, a.versions, a.steps)

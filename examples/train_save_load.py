"""Fine-tune LoRA under FSDP with torchrun, save it with `save_lora`, then load it with plain peft and generate.

    # 1. train a few steps on 2 ranks and save the adapter (every rank calls save_lora: it is a collective)
    torchrun --standalone --nproc_per_node 2 examples/train_save_load.py train runs/demo --fsdp fsdp2
    # 2. a fresh process, no FSDP, no kit: load base model + adapter with plain transformers/peft and generate
    python examples/train_save_load.py generate runs/demo

The base model here is the kit's tiny random llama, saved by rank 0 so that step 2 can load it like any
checkpoint; in a real script it is `AutoModelForCausalLM.from_pretrained(...)` on every rank.
"""
import argparse, os, sys
from pathlib import Path

import torch
import torch.distributed as dist

PROMPT = torch.arange(3, 11).unsqueeze(0)    # a fixed prompt, to compare the trained and the reloaded model


def train(out:Path, steps:int, fsdp:str):
    from peft import LoraConfig, get_peft_model
    from lora_fsdp_kit.export.core import save_lora
    from lora_fsdp_kit.models import tiny_model
    from lora_fsdp_kit.plan.wrap import WrapConfig

    dist.init_process_group("gloo")          # torchrun set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    rank = dist.get_rank()
    base = tiny_model("llama")               # the same weights on every rank (seeded)
    if rank == 0: base.save_pretrained(out/"base")
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    # peft's own FSDP policy: LoRA leaves and decoder layers are units (FSDP1: frozen and trainable tensors in one
    # unit need use_orig_params)
    config = WrapConfig(flavour=fsdp, policy="peft", use_orig_params=fsdp == "fsdp1")
    model = config.wrap(model)

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    vocab = base.config.vocab_size
    g = torch.Generator().manual_seed(rank)  # each rank its own data
    for step in range(steps):
        ids = torch.randint(0, vocab, (2, 16), generator=g)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward(); opt.step(); opt.zero_grad()
        if rank == 0: print(f"step {step}: loss {loss.item():.4f}", flush=True)

    save_lora(model, out/"adapter")          # on EVERY rank: rank 0 writes, all ranks agree that it is there
    with torch.no_grad(): logits = model(input_ids=PROMPT).logits   # a forward is a collective too
    if rank == 0:
        torch.save(logits, out/"trained_logits.pt")
        print(f"saved {sorted(p.name for p in (out/'adapter').iterdir())}", flush=True)
    # gloo: a rank that tears down its group while a peer is still reading the last collective's bytes can abort the
    # peer ("terminate called without an active exception"); a barrier first lets every rank finish reading
    dist.barrier()
    dist.destroy_process_group()


def generate(out:Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(out/"base")
    model = PeftModel.from_pretrained(base, out/"adapter").eval()
    with torch.no_grad(): logits = model(input_ids=PROMPT).logits
    diff = (logits - torch.load(out/"trained_logits.pt")).abs().max().item()
    print(f"max |logits - trained logits| = {diff:.3g}")
    if diff > 1e-5: sys.exit("the reloaded adapter does not reproduce the trained model")
    tokens = model.generate(input_ids=PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=8,
                            do_sample=False, pad_token_id=0)
    print(f"generated: {tokens[0, PROMPT.shape[1]:].tolist()}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("step", choices=["train", "generate"])
    ap.add_argument("out", type=Path, help="run folder: base/, adapter/ and trained_logits.pt go there")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--fsdp", choices=["fsdp1", "fsdp2"], default="fsdp2")
    a = ap.parse_args()
    if a.step == "train": train(a.out, a.steps, a.fsdp)
    else: generate(a.out)

"""`fits` exact on the held-out rows of issue 46 (deliverable 2): on real gloo ranks (the CPU allocator's running total,
`lora_fsdp_kit.fits.steppeak`), each rank's peak is within 0.1 % of the prediction's `peak` and inside `[peak, worst_peak]`:
DoRA under FSDP2 and FSDP1 (batch 2 x seq 37), FSDP2 without reshard after forward, FSDP1 NO_SHARD, FSDP1
SHARD_GRAD_OP on Mistral (sliding window), GPT-2 in eval mode (FSDP1 layers + orig, bf16 compute),
_HYBRID_SHARD_ZERO2 at world 4, Phi-3 (LoRA r=64 on qkv_proj/gate_up_proj, dropout 0.05) under FSDP2 at worlds 3 and
4 and under FSDP1 SHARD_GRAD_OP + orig at world 3; one launch of 4 ranks. Measured 2026-12-06 (2 cores): FSDP1 rows
equal to the byte; FSDP2 and hybrid rows 8-16 B (4 B per rank of the mesh) above `peak`. Before the trace tracked the
Python numbers autograd keeps (`fits_trace._SavedNumbers`: peft's LoRA scaling, 8 B per LoRA layer), every rank read
32-96 B above `peak`, and NO_SHARD (`worst_peak == peak`) lay outside its band."""
import functools

import pytest

from lora_fsdp_kit.fits.core import predict_step_memory
from real_steps import assert_exact, measure_while_predicting
from lora_fsdp_kit.fits.steppeak import case_model
from lora_fsdp_kit.plan.wrap import WrapConfig

BATCH, SEQ = 2, 37
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=256, hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               sliding_window=32)
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64, n_head=4, n_positions=128,
            vocab_size=256)
PHI3 = dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=128, pad_token_id=0)
PHI3_LORA = dict(config=PHI3, targets=("qkv_proj", "gate_up_proj"), r=64, dropout=0.05, train=True)
ORIG = dict(flavour="fsdp1", policy="layer", use_orig_params=True)
CASES = {   # name: (world, steppeak case fields, WrapConfig fields)
    "dora fsdp2": (2, dict(model="llama", use_dora=True), dict(flavour="fsdp2")),
    "dora fsdp1": (2, dict(model="llama", use_dora=True), dict(flavour="fsdp1", policy="lora")),
    "fsdp2 no reshard after forward": (2, dict(model="llama"), dict(flavour="fsdp2", reshard_after_forward=False)),
    "fsdp1 NO_SHARD": (2, dict(model="llama"), dict(flavour="fsdp1", policy="lora", sharding="NO_SHARD")),
    "mistral fsdp1 SHARD_GRAD_OP": (2, dict(config=MISTRAL),
                                    dict(flavour="fsdp1", policy="lora", sharding="SHARD_GRAD_OP")),
    "gpt2 eval fsdp1 layer orig bf16": (2, dict(config=GPT2, targets=("c_attn", "c_proj"), train=False),
                                        dict(ORIG, mixed_precision="bf16")),
    "llama _HYBRID_SHARD_ZERO2 w4": (4, dict(model="llama"),
                                     dict(flavour="fsdp1", policy="lora", sharding="_HYBRID_SHARD_ZERO2")),
    "phi3 fsdp2 w3": (3, PHI3_LORA, dict(flavour="fsdp2")),
    "phi3 fsdp2 w4": (4, PHI3_LORA, dict(flavour="fsdp2")),
    "phi3 fsdp1 SHARD_GRAD_OP orig w3": (3, PHI3_LORA, dict(ORIG, sharding="SHARD_GRAD_OP")),
}
KNOWN = {}   # name: why it is off (a strict xfail)

@functools.cache
def predicted(name:str):
    world, case, wrap = CASES[name]
    return predict_step_memory(case_model(case, "meta"), world=world, wrap=WrapConfig(**wrap), batch=BATCH, seq=SEQ,
                               backend="gloo")

@pytest.fixture(scope="module")
def real():
    "{name: [peak of rank 0, rank 1, ...]}: every case in one launch of 4 ranks, measured while this process traces."
    names = list(CASES)
    spec = [dict(CASES[n][1], wrap=WrapConfig(**CASES[n][2]).to_dict(), batch=BATCH, seq=SEQ, world=CASES[n][0])
            for n in names]
    return dict(zip(names, measure_while_predicting(spec, [CASES[n][0] for n in names], 4,
                                                    lambda i: predicted(names[i]))))

@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN[n]))
                                  if n in KNOWN else n for n in CASES])
def test_peak_within_a_tenth_of_a_percent_and_inside_the_band(real, name):
    got, pred = real[name], predicted(name)
    assert_exact(name, got, pred)
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        # a collective buffer a gloo thread frees late can only raise a reading: the lower one is the step's own
        assert t.peak <= g <= t.worst_peak, (f"rank {r}: measured {g:,} outside [{t.peak:,}, {t.worst_peak:,}] "
                                             f"({pred.label})")

"""`fits` beyond the zoo at worlds 3 and 4 (issue 31 item 7): on real gloo ranks (the CPU allocator's running total,
`lora_fsdp_kit.fits.steppeak`), each rank's peak lies between the prediction's `peak` (-1 %) and its `worst_peak` (+1 %),
for GPT-2 (transformers' Conv1D projections, tied embeddings, dropout in train mode) under FSDP2 and FSDP1, DoRA
(`add_lora(use_dora=True)`) under FSDP2 and FSDP1, a Qwen3 MoE (fused experts), a Llama with tied embeddings and
LoRA dropout in train mode, and a Mistral (a sliding window) with activation checkpointing; 7 cases in one launch of 4
ranks (world-3 cases on ranks 0-2). Measured 2026-12-03: Mistral -0.002 % (FSDP2 and FSDP1, checkpointed), Gemma 2
-0.005 %; before the training step dropped its KV cache, fits refused both. And a family the trace does
not hold to 1 % (Mamba's state-space layers) is predicted with an answer that says so.
Measured (2026-12-02, 2 cores): see the report of issue 31 item 7; DoRA was +9.5 % before the trace's module hooks
stopped keeping its detached `lora_weight` branch alive."""
import functools

import pytest

from lora_fsdp_kit.fits.core import inexact_families, predict_step_memory
from real_steps import assert_in_range, measure_while_predicting
from lora_fsdp_kit.fits.steppeak import case_model
from lora_fsdp_kit.plan.wrap import WrapConfig

BATCH, SEQ = 2, 64
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64, n_head=4, n_positions=128,
            vocab_size=256)   # Conv1D projections, tied embeddings, dropout 0.1
GPT2_LORA = dict(config=GPT2, targets=("c_attn", "c_proj"), train=True)
# a sliding window shorter than the sequence: under activation checkpointing a step with a KV cache fails in the
# recompute (the keys outgrow the mask), on real ranks and in the trace alike: this job turns the cache off
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=256, hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               sliding_window=32)
FSDP2, FSDP1 = dict(flavour="fsdp2"), dict(flavour="fsdp1", policy="lora")   # FSDP1: the kit's LoRA-leaf policy
FSDP1_ORIG = dict(flavour="fsdp1", policy="layer", use_orig_params=True)
CASES = {   # name: (world, steppeak case fields, WrapConfig fields)
    "gpt2 conv1d tied dropout fsdp2": (4, GPT2_LORA, FSDP2),
    "gpt2 conv1d tied dropout fsdp1 layer orig": (3, GPT2_LORA, FSDP1_ORIG),
    "llama dora fsdp2": (3, dict(model="llama", use_dora=True), FSDP2),
    "llama dora fsdp1": (4, dict(model="llama", use_dora=True), FSDP1),
    "qwen3_moe fsdp2": (4, dict(model="qwen3_moe", overrides=dict(experts_implementation="batched_mm")), FSDP2),
    "llama tied dropout train fsdp1": (3, dict(model="llama", overrides=dict(tie_word_embeddings=True),
                                               dropout=0.1, train=True), FSDP1),
    "mistral sliding window fsdp2 checkpointed": (3, dict(config=MISTRAL, use_cache=False),
                                                  dict(FSDP2, activation_checkpointing=True)),
}

@functools.cache
def predicted(name:str):
    world, case, wrap = CASES[name]
    return predict_step_memory(case_model(case, "meta"), world=world, wrap=WrapConfig(**wrap), batch=BATCH, seq=SEQ,
                               backend="gloo", use_cache=case.get("use_cache"))

@pytest.fixture(scope="module")
def real():
    "{name: [peak of rank 0, rank 1, ...]}: every case in one launch of 4 ranks, measured while this process traces."
    names = list(CASES)
    spec = [dict(CASES[n][1], wrap=WrapConfig(**CASES[n][2]).to_dict(), batch=BATCH, seq=SEQ, world=CASES[n][0])
            for n in names]
    return dict(zip(names, measure_while_predicting(spec, [CASES[n][0] for n in names], 4,
                                                    lambda i: predicted(names[i]))))

@pytest.mark.parametrize("name", list(CASES))
def test_real_ranks_within_the_predicted_range(real, name):
    got, pred = real[name], predicted(name)
    assert not pred.not_exact, pred.not_exact   # the trace claims these: it must hold them
    assert_in_range(name, got, pred)

MAMBA = dict(model_type="mamba", architectures=["MambaForCausalLM"], hidden_size=64, state_size=8,
             num_hidden_layers=2, vocab_size=256, expand=2, conv_kernel=4, time_step_rank=8)

def test_a_family_not_held_to_one_percent_says_so():
    "Mamba: +7.8 % against real ranks (the trace's out-of-place gradient adds), so the answer says it is not exact."
    pm = case_model(dict(config=MAMBA, targets=("in_proj", "x_proj", "dt_proj")), "meta")
    got = predict_step_memory(pm, world=2, batch=1, seq=16, backend="gloo")
    assert got.not_exact == inexact_families(pm)
    assert got.not_exact.startswith("not exact for mamba: its state-space"), got.not_exact
    assert got.not_exact in repr(got)
    llama = predicted("llama dora fsdp2")
    assert not llama.not_exact and "not exact" not in repr(llama)

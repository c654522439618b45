"""`fits` beyond the zoo, on real gloo ranks (the CPU allocator's running total, `lora_fsdp_kit.fits.steppeak`): every
case below in one launch of 4 ranks (a case of world k on ranks 0..k-1), measured while this process predicts. (They
were four launches in three files, the held-out rows, these, tests/test_fits_accuracy.py's and the step's own: one
launch pays the ranks' start and imports once.)

The step the job really runs, `STEP` (2 ranks, a tiny Mistral, batch 2 x seq 64): the forward's KV cache as
config.json (or the call) says, activation checkpointing by its implementation (torch's `checkpoint_wrapper` or
transformers' own), gradient accumulation under FSDP's no-sync, FSDP1's backward prefetch, autocast -- within 0.1 % of
the real ranks, whose step runs the same knobs with its own code (the two cache cases stepped twice, each rank's
lower reading kept: their test compares one case's readings with the other's).
Measured (2026-12, 2 ranks): checkpoint_wrapper with the config's use_cache (on) really peaks 4.7 % above the same step
with use_cache=False (1,473,024 vs 1,407,440 B), which the trace before predicted for both; every case within 0.01 %.

The held-out rows of issue 46 (deliverable 2), `HELD_OUT` (batch 2 x seq 37): each rank's peak within 0.1 % of the
prediction's `peak` and inside `[peak, worst_peak]`: DoRA under FSDP2 at world 3 and under FSDP1 at world 4 (measured
2026-12-07: -0.0015 % and to the byte; they were rows of `BEYOND` too, at seq 64 within its weaker band, and of this
set at world 2), FSDP2 without reshard after forward, FSDP1 NO_SHARD, FSDP1 SHARD_GRAD_OP on Mistral (sliding
window), GPT-2 in eval mode (FSDP1 layers + orig, bf16 compute), _HYBRID_SHARD_ZERO2 at world 4, Phi-3 (LoRA r=64 on
qkv_proj/gate_up_proj, dropout 0.05) under FSDP2 at worlds 3 and 4 and under FSDP1 SHARD_GRAD_OP + orig at world 3.
Measured 2026-12-06 (2 cores): FSDP1 rows equal to the byte; FSDP2 and hybrid rows 8-16 B (4 B per rank of the mesh)
above `peak`. Before the trace tracked the Python numbers autograd keeps (`fits_trace._SavedNumbers`: peft's LoRA
scaling, 8 B per LoRA layer), every rank read 32-96 B above `peak`, and NO_SHARD (`worst_peak == peak`) lay outside
its band. DoRA was +9.5 % before the trace's module hooks stopped keeping its detached `lora_weight` branch alive.

Beyond the zoo at worlds 3 and 4 (issue 31 item 7), `BEYOND` (batch 2 x seq 64): each rank's peak lies between the
prediction's `peak` (-1 %) and its `worst_peak` (+1 %), for GPT-2 (transformers' Conv1D projections, tied embeddings,
dropout in train mode) under FSDP2 and FSDP1, a Qwen3 MoE (fused experts), a Llama with tied embeddings and LoRA
dropout in train mode, and a Mistral (a sliding window) with activation checkpointing. Measured 2026-12-03: Mistral
-0.002 % (FSDP2 and FSDP1, checkpointed), Gemma 2 -0.005 %; before the training step dropped its KV cache, fits
refused both. And a family the trace does not hold to 1 % (Mamba's state-space layers) is predicted with an answer
that says so.

Configurations the zoo matrix of tests/test_fits.py does not hold, `UNHELD` (batch 2 x seq 64): within the same band,
and at world 2 also within 1 % of the usual peak or of the worst one: FSDP1 SHARD_GRAD_OP with use_orig_params (it
raised an AssertionError in the trace), fp32 master weights with bf16 compute under FSDP1 and FSDP2, a bf16 base with
fp32 LoRA, LoRA dropout in train mode, LoRA on the embeddings and the head, and models built in-process from small
transformers configs: GPT-2 (Conv1D, tied embeddings; its FSDP2 step in fp32 is `BEYOND`'s, at world 4) and Phi-3
(fused qkv). Measured (2026-12-02): every rank within 0.004 % of `peak`; `worst_peak` 4-10 % above. GPT-2 under FSDP1
with bf16 read -1.18 % (33,112 B: oneDNN's bf16 matmul buffers, taken from torch's CPU allocator inside the kernel)
until the trace counted them (`kernel_bytes.cpu_gemm_bytes`). Known misses would be strict xfails."""
import functools

import pytest

from lora_fsdp_kit.fits.core import FitsError, inexact_families, predict_step_memory
from real_steps import GLOO_SLACK, assert_exact, assert_in_range, measure_while_predicting
from lora_fsdp_kit.fits.steppeak import case_model
from lora_fsdp_kit.plan.wrap import WrapConfig

BATCH = 2
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=256, hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               sliding_window=32)
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64, n_head=4, n_positions=128,
            vocab_size=256)   # Conv1D projections, tied embeddings, dropout 0.1
PHI3 = dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=128, pad_token_id=0)
PHI3_LORA = dict(config=PHI3, targets=("qkv_proj", "gate_up_proj"), r=64, dropout=0.05, train=True)
GPT2_LORA = dict(config=GPT2, targets=("c_attn", "c_proj"), train=True)
FSDP2, FSDP1 = dict(flavour="fsdp2"), dict(flavour="fsdp1", policy="lora")   # FSDP1: the kit's LoRA-leaf policy
ORIG = dict(flavour="fsdp1", policy="layer", use_orig_params=True)

# ---------------------------------------------------------------- the held-out rows: exact, at seq 37
HELD_OUT = {   # name: (world, steppeak case fields, WrapConfig fields)
    "dora fsdp2 w3": (3, dict(model="llama", use_dora=True), FSDP2),
    "dora fsdp1 w4": (4, dict(model="llama", use_dora=True), FSDP1),
    "fsdp2 no reshard after forward": (2, dict(model="llama"), dict(FSDP2, reshard_after_forward=False)),
    "fsdp1 NO_SHARD": (2, dict(model="llama"), dict(FSDP1, sharding="NO_SHARD")),
    "mistral fsdp1 SHARD_GRAD_OP": (2, dict(config=MISTRAL), dict(FSDP1, sharding="SHARD_GRAD_OP")),
    "gpt2 eval fsdp1 layer orig bf16": (2, dict(config=GPT2, targets=("c_attn", "c_proj"), train=False),
                                        dict(ORIG, mixed_precision="bf16")),
    "llama _HYBRID_SHARD_ZERO2 w4": (4, dict(model="llama"), dict(FSDP1, sharding="_HYBRID_SHARD_ZERO2")),
    "phi3 fsdp2 w3": (3, PHI3_LORA, FSDP2),
    "phi3 fsdp2 w4": (4, PHI3_LORA, FSDP2),
    "phi3 fsdp1 SHARD_GRAD_OP orig w3": (3, PHI3_LORA, dict(ORIG, sharding="SHARD_GRAD_OP")),
}
# ---------------------------------------------------------------- beyond the zoo: within the band, at seq 64
# a sliding window shorter than the sequence: under activation checkpointing a step with a KV cache fails in the
# recompute (the keys outgrow the mask), on real ranks and in the trace alike: this job turns the cache off
BEYOND = {   # name: (world, steppeak case fields, WrapConfig fields)
    "gpt2 conv1d tied dropout fsdp2": (4, GPT2_LORA, FSDP2),
    "gpt2 conv1d tied dropout fsdp1 layer orig": (3, GPT2_LORA, ORIG),
    "qwen3_moe fsdp2": (4, dict(model="qwen3_moe", overrides=dict(experts_implementation="batched_mm")), FSDP2),
    "llama tied dropout train fsdp1": (3, dict(model="llama", overrides=dict(tie_word_embeddings=True),
                                               dropout=0.1, train=True), FSDP1),
    "mistral sliding window fsdp2 checkpointed": (3, dict(config=MISTRAL, use_cache=False),
                                                  dict(FSDP2, activation_checkpointing=True)),
}
# ---------------------------------------------------------------- off the zoo matrix: the band, and at world 2 a figure
UNHELD = {   # name: (world, steppeak case fields (storage too: the prediction is given it), WrapConfig fields)
    "llama fsdp1 SHARD_GRAD_OP orig": (2, dict(model="llama"), dict(ORIG, sharding="SHARD_GRAD_OP")),
    "phi3 fsdp1 SHARD_GRAD_OP orig": (3, dict(config=PHI3, targets=("qkv_proj", "o_proj")),
                                      dict(ORIG, sharding="SHARD_GRAD_OP")),
    "llama fsdp2 fp32 master bf16": (2, dict(model="llama", overrides=dict(dtype="bfloat16"), param_dtype="fp32"),
                                     dict(FSDP2, mixed_precision="bf16")),
    "qwen2 fsdp1 fp32 master bf16": (3, dict(model="qwen2", overrides=dict(dtype="bfloat16"), param_dtype="fp32"),
                                     dict(ORIG, mixed_precision="bf16")),
    "llama fsdp2 bf16 base fp32 lora": (3, dict(model="llama", param_dtype="bf16", lora_dtype="fp32"), FSDP2),
    "llama fsdp2 dropout train": (3, dict(model="llama", dropout=0.1, train=True), FSDP2),
    # peft's wrapper of a LoRA'd embedding has no `num_embeddings`: the trace could not start (AttributeError)
    "llama fsdp2 lora on embeddings and head": (3, dict(model="llama", targets=("q_proj", "embed_tokens", "lm_head")),
                                                FSDP2),
    "gpt2 fsdp1 layer orig bf16 train": (2, GPT2_LORA, dict(ORIG, mixed_precision="bf16")),
}
# ---------------------------------------------------------------- the step's own knobs: exact, each case twice
MISTRAL_STEP = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=256, hidden_size=64,
                    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
STEP = {   # name: (world, steppeak case fields (the step's knobs: predict_step_memory's too), WrapConfig fields)
    # the held-out case of issue 46: the config's use_cache left on, as accelerate's checkpointing leaves it
    "wrapper, config's cache": (2, dict(config=MISTRAL_STEP), dict(FSDP2, activation_checkpointing="wrapper")),
    "wrapper, use_cache=False": (2, dict(config=MISTRAL_STEP, use_cache=False),
                                 dict(FSDP2, activation_checkpointing="wrapper")),
    # transformers' own checkpointing, in training (as a trainer calls .train()): it turns the cache off itself
    "hf, train": (2, dict(config=MISTRAL_STEP, train=True), dict(FSDP2, activation_checkpointing="hf")),
    # FSDP1 layer units keep each layer's unsharded flat gradient across micro-batches; transformers' NO_PREFETCH
    "fsdp1 layers, grad_accum 2, no prefetch": (2, dict(config=MISTRAL_STEP, grad_accum=2),
                                                dict(ORIG, backward_prefetch=None)),
    "fsdp2, grad_accum 2, autocast bf16": (2, dict(config=MISTRAL_STEP, grad_accum=2, autocast="bf16"), FSDP2),
}
SEQ = {**{n: 37 for n in HELD_OUT}, **{n: 64 for n in {**BEYOND, **UNHELD, **STEP}}}
CASES = {**HELD_OUT, **BEYOND, **UNHELD, **STEP}
KNOBS = ("use_cache", "grad_accum", "autocast")   # the step's, as the ranks run it
# the cache test compares one case's readings with another's: a collective buffer a gloo thread frees late (a reading
# at `worst_peak`, which `assert_exact` accepts) would blur that, so these two are stepped twice, the lower kept
TWICE = ("wrapper, config's cache", "wrapper, use_cache=False")
KNOWN = {}   # name: why it is off (a strict xfail: it fails the day it is fixed, and the entry goes)
STORAGE = ("param_dtype", "lora_dtype")

@functools.cache
def predicted(name:str):
    "The prediction of a case: its model on meta as built, stored as the case says (the ranks cast it so)."
    world, case, wrap = CASES[name]
    meta = case_model({k: v for k, v in case.items() if k not in STORAGE}, "meta")
    return predict_step_memory(meta, world=world, wrap=WrapConfig(**wrap), batch=BATCH, seq=SEQ[name],
                               backend="gloo", **{k: case[k] for k in STORAGE + KNOBS if k in case})

@pytest.fixture(scope="module")
def real():
    """{name: [peak of rank 0, rank 1, ...]}: every case in one launch of 4 ranks, measured while this process traces;
    the `TWICE` cases twice, each rank's lower reading kept."""
    names = list(CASES) + list(TWICE)
    spec = [dict(CASES[n][1], wrap=WrapConfig(**CASES[n][2]).to_dict(), batch=BATCH, seq=SEQ[n], world=CASES[n][0])
            for n in names]
    out = {}
    for n, got in zip(names, measure_while_predicting(spec, [CASES[n][0] for n in names], 4,
                                                      lambda i: predicted(names[i]))):
        # a rank's error text stays (its test shows it); two readings: the lower
        out[n] = got if n not in out else [a if not isinstance(b, int) else b if not isinstance(a, int) else min(a, b)
                                            for a, b in zip(out[n], got)]
    return out


def _known(names)->list:
    "The names, each known miss marked a strict xfail (its reason: `KNOWN`)."
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN[n])) if n in KNOWN else n for n in names]

@pytest.mark.parametrize("name", _known(HELD_OUT))
def test_peak_within_a_tenth_of_a_percent_and_inside_the_band(real, name):
    got, pred = real[name], predicted(name)
    assert_exact(name, got, pred)
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        # a collective buffer a gloo thread frees late can only raise a reading: the lower one is the step's own;
        # at the band's top the gloo thread holds a few bytes of its own beside that buffer (seen: +12 B, +16 B)
        assert t.peak <= g <= t.worst_peak + GLOO_SLACK, (f"rank {r}: measured {g:,} outside [{t.peak:,}, "
                                                          f"{t.worst_peak:,}] ({pred.label})")

@pytest.mark.parametrize("name", list(BEYOND))
def test_real_ranks_within_the_predicted_range(real, name):
    got, pred = real[name], predicted(name)
    assert not pred.not_exact, pred.not_exact   # the trace claims these: it must hold them
    assert_in_range(name, got, pred)

@pytest.mark.parametrize("name", _known(UNHELD))
def test_off_the_matrix_within_the_predicted_range(real, name):
    got, pred = real[name], predicted(name)
    assert_in_range(name, got, pred)
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        # at world 2 a rank's peak is one of the two figures, to 1 %: the usual one, or (gloo's late-freed
        # all-gather, first seen at worlds 3-4, then once at world 2 on a busy machine: GPT-2 FSDP2 rank 1, -5.2 % /
        # +0.3 %) the worst
        near = lambda p: abs(p / g - 1) <= 0.01
        if len(got) == 2: assert near(t.peak) or near(t.worst_peak), \
            f"rank {r}: peak {t.peak / g - 1:+.3%}, worst {t.worst_peak / g - 1:+.3%}, {pred.label}"
        assert sum(t.by_category.values()) == t.peak

MAMBA = dict(model_type="mamba", architectures=["MambaForCausalLM"], hidden_size=64, state_size=8,
             num_hidden_layers=2, vocab_size=256, expand=2, conv_kernel=4, time_step_rank=8)

def test_a_family_not_held_to_one_percent_says_so():
    "Mamba: +7.8 % against real ranks (the trace's out-of-place gradient adds), so the answer says it is not exact."
    pm = case_model(dict(config=MAMBA, targets=("in_proj", "x_proj", "dt_proj")), "meta")
    got = predict_step_memory(pm, world=2, batch=1, seq=16, backend="gloo")
    assert got.not_exact == inexact_families(pm)
    assert got.not_exact.startswith("not exact for mamba: its state-space"), got.not_exact
    assert got.not_exact in repr(got)
    llama = predicted("dora fsdp2 w3")
    assert not llama.not_exact and "not exact" not in repr(llama)

@pytest.mark.parametrize("name", list(STEP))
def test_the_step_within_a_tenth_of_a_percent_of_real_ranks(real, name):
    assert_exact(name, real[name], predicted(name))

def test_the_config_cache_is_the_jobs(real):
    "The real step with the config's cache peaks above the one without, and the prediction says why, in words."
    on, off = real["wrapper, config's cache"], real["wrapper, use_cache=False"]
    assert min(on) > 1.03 * max(off), (on, off)   # the reference runs the job's forward, not a cache-free one
    assert predicted("wrapper, config's cache").forward == (
        "checkpoint_wrapper per decoder layer; use_cache on (config.json): a DynamicCache keeps each layer's keys and "
        "values")
    assert "use_cache off (use_cache=False)" in predicted("wrapper, use_cache=False").forward
    hf = predicted("hf, train")
    assert hf.forward.startswith("transformers' gradient checkpointing") and \
        "use_cache off (transformers turns it off under its own checkpointing)" in hf.forward
    assert hf.forward in repr(hf) and "ac=hf" in hf.label
    assert "2 micro-batches per optimizer step" in predicted("fsdp1 layers, grad_accum 2, no prefetch").forward

def test_a_recompute_that_meets_its_cache_is_refused_with_the_fix():
    "A sliding window shorter than the sequence: under checkpoint_wrapper the recompute outgrows the mask, as for real."
    pm = case_model(dict(config=dict(MISTRAL_STEP, sliding_window=32)), "meta")
    with pytest.raises(FitsError, match="fix: use_cache=False"):
        predict_step_memory(pm, world=2, activation_checkpointing=True, batch=BATCH, seq=64, backend="gloo")

def test_the_step_knobs_are_checked():
    pm = case_model(dict(config=MISTRAL_STEP), "meta")
    for kw, text in ((dict(activation_checkpointing="torch"), "activation_checkpointing must be False ('off'), "
                      "'wrapper' (True, 'on'"), (dict(use_cache="yes"), "use_cache must be None"),
                     (dict(grad_accum=0), "grad_accum must be a whole number >= 1"),
                     (dict(autocast="fp8"), "autocast must be None, 'bf16' or 'fp16'")):
        with pytest.raises(FitsError, match=text.replace("(", r"\(").replace(")", r"\)")):
            predict_step_memory(pm, world=2, **kw)
    with pytest.raises(ValueError, match="backward_prefetch is FSDP1's"):
        predict_step_memory(pm, world=2, wrap=WrapConfig(backward_prefetch=None))

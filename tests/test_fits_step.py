"""`predict_step_memory` traces the step the job really runs -- the forward's KV cache as config.json (or the call)
says, activation checkpointing by its implementation (torch's `checkpoint_wrapper` or transformers' own), gradient
accumulation under FSDP's no-sync, FSDP1's backward prefetch, autocast -- within 0.1 % of real gloo ranks (the CPU
allocator's running total, `lora_fsdp_kit.fits.steppeak`, whose step runs the same knobs with its own code).
Measured (2026-12, 2 ranks, tiny Mistral, 2 x 64 tokens): checkpoint_wrapper with the config's use_cache (on) really
peaks 4.7 % above the same step with use_cache=False (1,473,024 vs 1,407,440 B), which the trace before this file
predicted for both; every case below within 0.01 %."""
import functools

import pytest

from lora_fsdp_kit.fits.core import FitsError, predict_step_memory
from lora_fsdp_kit.fits.steppeak import case_model
from lora_fsdp_kit.plan.wrap import WrapConfig
from real_steps import assert_exact, measure_while_predicting

BATCH, SEQ, WORLD = 2, 64, 2
MISTRAL = dict(model_type="mistral", architectures=["MistralForCausalLM"], vocab_size=256, hidden_size=64,
               intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
FSDP2 = dict(flavour="fsdp2")
FSDP1_ORIG = dict(flavour="fsdp1", policy="layer", use_orig_params=True)
CASES = {   # name: (WrapConfig fields, the step's knobs (predict_step_memory's and the steppeak case's), model fields)
    # the held-out case of issue 46: the config's use_cache left on, as accelerate's checkpointing leaves it
    "wrapper, config's cache": (dict(FSDP2, activation_checkpointing="wrapper"), {}, {}),
    "wrapper, use_cache=False": (dict(FSDP2, activation_checkpointing="wrapper"), dict(use_cache=False), {}),
    # transformers' own checkpointing, in training (as a trainer calls .train()): it turns the cache off itself
    "hf, train": (dict(FSDP2, activation_checkpointing="hf"), {}, dict(train=True)),
    # FSDP1 layer units keep each layer's unsharded flat gradient across micro-batches; transformers' NO_PREFETCH
    "fsdp1 layers, grad_accum 2, no prefetch": (dict(FSDP1_ORIG, backward_prefetch=None), dict(grad_accum=2), {}),
    "fsdp2, grad_accum 2, autocast bf16": (FSDP2, dict(grad_accum=2, autocast="bf16"), {}),
}

def model(extra:dict, **config): return case_model(dict(config=dict(MISTRAL, **config), **extra), "meta")

@functools.cache
def predicted(name:str):
    wrap, step, extra = CASES[name]
    return predict_step_memory(model(extra), world=WORLD, wrap=WrapConfig(**wrap), batch=BATCH, seq=SEQ,
                               backend="gloo", **step)

@pytest.fixture(scope="module")
def real():
    "{name: [lower peak of 2 runs, rank 0 and 1]}: each case twice in one launch of 2 ranks, while this process traces."
    names = list(CASES)
    spec = [dict(config=MISTRAL, wrap=WrapConfig(**CASES[n][0]).to_dict(), batch=BATCH, seq=SEQ, **CASES[n][1],
                 **CASES[n][2]) for n in names]
    return dict(zip(names, measure_while_predicting(spec, [WORLD] * len(names), WORLD,
                                                    lambda i: predicted(names[i]), repeat=2)))

@pytest.mark.parametrize("name", list(CASES))
def test_peak_within_a_tenth_of_a_percent_of_real_ranks(real, name):
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
    pm = model({}, sliding_window=32)
    with pytest.raises(FitsError, match="fix: use_cache=False"):
        predict_step_memory(pm, world=WORLD, activation_checkpointing=True, batch=BATCH, seq=SEQ, backend="gloo")

def test_the_step_knobs_are_checked():
    pm = model({})
    for kw, text in ((dict(activation_checkpointing="torch"), "activation_checkpointing must be False ('off'), "
                      "'wrapper' (True, 'on'"), (dict(use_cache="yes"), "use_cache must be None"),
                     (dict(grad_accum=0), "grad_accum must be a whole number >= 1"),
                     (dict(autocast="fp8"), "autocast must be None, 'bf16' or 'fp16'")):
        with pytest.raises(FitsError, match=text.replace("(", r"\(").replace(")", r"\)")):
            predict_step_memory(pm, world=WORLD, **kw)
    with pytest.raises(ValueError, match="backward_prefetch is FSDP1's"):
        predict_step_memory(pm, world=WORLD, wrap=WrapConfig(backward_prefetch=None))

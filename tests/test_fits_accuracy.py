"""`fits` beyond the zoo (issue 31). (1) The reduced trace (4 and 5 decoder layers, extended to L) equals the full
trace to the byte -- peak, worst peak, every category, shard and optimizer bytes, which ranks share a trace -- over a
covering array of wrappings x models x worlds x backends (that ranks of one signature trace alike is
tests/test_fits_grouping.py). (2) On real gloo ranks (the CPU allocator's running total,
`lora_fsdp_kit.fits.steppeak`), each rank's peak lies between the prediction's `peak` (-1 %) and its `worst_peak` (+1 %),
for configurations the zoo matrix of tests/test_fits.py does not hold: FSDP1 SHARD_GRAD_OP with use_orig_params (it
raised an AssertionError in the trace), fp32 master weights with bf16 compute under FSDP1 and FSDP2, a bf16 base with
fp32 LoRA, LoRA dropout in train mode, and models built in-process from small transformers configs: GPT-2 (Conv1D,
tied embeddings) and Phi-3 (fused qkv); at world 2 also within 1 % of the usual peak or of the worst one. Measured
(2026-12-02): every rank of the 8 cases within 0.004 % of `peak`; `worst_peak` 4-10 % above. GPT-2 under FSDP1 with bf16 read -1.18 %
(33,112 B: oneDNN's bf16 matmul buffers, taken from torch's CPU allocator inside the kernel) until the trace counted
them (`kernel_bytes.cpu_gemm_bytes`). Known misses would be strict xfails."""
import functools

import pytest

from lora_fsdp_kit.fits.core import predict_step_memory
from lora_fsdp_kit.fits.trace import trace_rank
from lora_fsdp_kit.fits.reduced import why_not_reduced
from real_steps import assert_in_range, measure_while_predicting
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.fits.steppeak import case_model
from lora_fsdp_kit.testing.core import covering_array
from lora_fsdp_kit.plan.wrap import WrapConfig

# ---------------------------------------------------------------- (1) reduced trace == full trace, to the byte
MOE = dict(experts_implementation="batched_mm")
# (plain FSDP2 is "fsdp2 hybrid" less the hybrid mesh: a row of its own would prove nothing more)
WRAPS = {"fsdp2 ac bf16": WrapConfig(flavour="fsdp2", activation_checkpointing=True, mixed_precision="bf16"),
         "fsdp2 no-reshard fp16": WrapConfig(flavour="fsdp2", reshard_after_forward=False, mixed_precision="fp16"),
         "fsdp2 hybrid": WrapConfig(flavour="fsdp2", sharding="HYBRID", shard_size=2),
         "fsdp1 lora": WrapConfig(flavour="fsdp1", policy="lora"),
         "fsdp1 layer orig bf16 ac": WrapConfig(flavour="fsdp1", policy="layer", use_orig_params=True,
                                                mixed_precision="bf16", activation_checkpointing=True),
         "fsdp1 sgo orig": WrapConfig(flavour="fsdp1", policy="lora", sharding="SHARD_GRAD_OP", use_orig_params=True)}
ROWS = covering_array(dict(wrap=list(WRAPS), model=["llama", "qwen3_moe"], world=[2, 4], backend=["gloo", "nccl"]),
                      allowed=lambda r: "hybrid" not in r["wrap"] or r["world"] == 4)

@functools.cache
def six_layers(name:str):
    "The fewest layers the reduction extends (traces 4 and 5, extends to 6); LoRA on q_proj only: ~1/3 fewer ops."
    cfg = dict(shipped_config(name), num_hidden_layers=6, **(MOE if "moe" in name else {}))
    return add_lora(model_from_config(cfg, device="meta"), r=8, target_modules=("q_proj",))

@pytest.mark.parametrize("row", ROWS, ids=lambda r: "-".join(map(str, r.values())))
def test_reduced_trace_equals_the_full_trace(row):
    pm, cfg = six_layers(row["model"]), WRAPS[row["wrap"]]
    assert why_not_reduced(pm, cfg) is None
    args = (pm, cfg, row["world"], row["world"] - 1, 1, 16, row["backend"])
    full, red = trace_rank(*args, layers="all"), trace_rank(*args)
    assert red.traced_layers == (4, 5, 6) and full.traced_layers == ()
    # (the peak's module is not compared: where several ops tie for the peak -- each checkpointed layer's backward
    # holds the same bytes -- the two traces may name different ones)
    for f in ("peak", "worst_peak", "by_category", "sharded_bytes", "optimizer_bytes"):
        assert getattr(red, f) == getattr(full, f), (f, getattr(red, f), getattr(full, f))
    classes = lambda sig: [[sig[a] == sig[b] for b in range(len(sig))] for a in range(len(sig))]
    assert classes(red.signatures) == classes(full.signatures)   # the same ranks share a trace
    assert max(b for _, b in red.timeline) == red.peak

def test_what_is_traced_whole_says_why():
    pm = six_layers("llama")
    root = WrapConfig(flavour="fsdp1", policy="root", use_orig_params=True)
    assert why_not_reduced(pm, root) == "unit '<root>' holds parameters of several layers"
    two = add_lora(model_from_config(shipped_config("llama"), device="meta"))
    assert why_not_reduced(two, WrapConfig()) == "2 layers: no fewer to trace"
    t = trace_rank(pm, root, 2, 0, 1, 16)
    assert t.traced_layers == ()

# (a reduced trace traced in forked copies of the process gives the in-process answer: chapter 11a's trace_many cell,
# at world 8, two ranks of different signatures, so a separate test here re-proved it)

# ---------------------------------------------------------------- (2) real ranks, beyond the zoo
BATCH, SEQ = 2, 64
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64, n_head=4, n_positions=128,
            vocab_size=256)   # Conv1D projections, tied embeddings, dropout 0.1
PHI3 = dict(model_type="phi3", architectures=["Phi3ForCausalLM"], hidden_size=64, intermediate_size=128,
            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
            max_position_embeddings=128, pad_token_id=0)   # fused qkv_proj and gate_up_proj
ORIG_LAYER = dict(flavour="fsdp1", policy="layer", use_orig_params=True)
REAL = {   # name: (world, case fields, WrapConfig fields, predict_step_memory's storage keywords)
    "llama fsdp1 SHARD_GRAD_OP orig": (2, dict(model="llama"), dict(ORIG_LAYER, sharding="SHARD_GRAD_OP"), {}),
    "phi3 fsdp1 SHARD_GRAD_OP orig": (3, dict(config=PHI3, targets=("qkv_proj", "o_proj")),
                                      dict(ORIG_LAYER, sharding="SHARD_GRAD_OP"), {}),
    "llama fsdp2 fp32 master bf16": (2, dict(model="llama", overrides=dict(dtype="bfloat16"), param_dtype="fp32"),
                                     dict(flavour="fsdp2", mixed_precision="bf16"), dict(param_dtype="fp32")),
    "qwen2 fsdp1 fp32 master bf16": (3, dict(model="qwen2", overrides=dict(dtype="bfloat16"), param_dtype="fp32"),
                                     dict(ORIG_LAYER, mixed_precision="bf16"), dict(param_dtype="fp32")),
    "llama fsdp2 bf16 base fp32 lora": (3, dict(model="llama", param_dtype="bf16", lora_dtype="fp32"),
                                        dict(flavour="fsdp2"), dict(param_dtype="bf16", lora_dtype="fp32")),
    "llama fsdp2 dropout train": (3, dict(model="llama", dropout=0.1, train=True), dict(flavour="fsdp2"), {}),
    # peft's wrapper of a LoRA'd embedding has no `num_embeddings`: the trace could not start (AttributeError)
    "llama fsdp2 lora on embeddings and head": (3, dict(model="llama", targets=("q_proj", "embed_tokens", "lm_head")),
                                                dict(flavour="fsdp2"), {}),
    "gpt2 fsdp2 fp32 train": (2, dict(config=GPT2, targets=("c_attn", "c_proj"), train=True),
                              dict(flavour="fsdp2"), {}),
    "gpt2 fsdp1 layer orig bf16 train": (2, dict(config=GPT2, targets=("c_attn", "c_proj"), train=True),
                                         dict(ORIG_LAYER, mixed_precision="bf16"), {}),
}
KNOWN = {}   # name: why it is off (a strict xfail: it fails the day it is fixed, and the entry goes)

def spec(name:str)->dict:
    world, case, wrap, _ = REAL[name]
    return dict(case, wrap=WrapConfig(**wrap).to_dict(), batch=BATCH, seq=SEQ, world=world)

@functools.cache
def predicted(name:str):
    world, case, wrap, storage = REAL[name]
    meta = case_model({k: v for k, v in case.items() if k not in ("param_dtype", "lora_dtype")}, "meta")
    return predict_step_memory(meta, world=world, wrap=WrapConfig(**wrap), batch=BATCH, seq=SEQ, backend="gloo",
                               **storage)

@pytest.fixture(scope="module")
def real():
    "{name: [peak of rank 0, rank 1, ...]}: every case in one launch of 3 ranks, measured while this process traces."
    names = list(REAL)
    return dict(zip(names, measure_while_predicting([spec(n) for n in names], [REAL[n][0] for n in names], 3,
                                                    lambda i: predicted(names[i]))))

@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=KNOWN[n]))
                                  if n in KNOWN else n for n in REAL])
def test_real_ranks_within_the_predicted_range(real, name):
    got, pred = real[name], predicted(name)
    assert_in_range(name, got, pred)
    for r, g in enumerate(got):
        t = pred.traces[pred.trace_of[r]]
        # at world 2 a rank's peak is one of the two figures, to 1 %: the usual one, or (gloo's late-freed all-gather,
        # first seen at worlds 3-4, then once at world 2 on a busy machine: GPT-2 FSDP2 rank 1, -5.2 % / +0.3 %) the worst
        near = lambda p: abs(p / g - 1) <= 0.01
        if len(got) == 2: assert near(t.peak) or near(t.worst_peak), \
            f"rank {r}: peak {t.peak / g - 1:+.3%}, worst {t.worst_peak / g - 1:+.3%}, {pred.label}"
        assert sum(t.by_category.values()) == t.peak

# ---------------------------------------------------------------- (1b) the primed step == a step after a first iteration
# A trace runs no first iteration: `fits_trace._prime` makes what one leaves (FSDP's lazy state, FSDP2's all-gather
# outputs and unsharded parameters, AdamW's state) and `_discount` takes off the state of parameters the step gives no
# gradient. Here the trace's former way stands in for `_prime`: a whole first iteration, untracked. Rows: a unit no
# batch reaches (the Omni thinker's towers) under FSDP2 and FSDP1, FSDP1's rate limiter (SHARD_GRAD_OP), no reshard
# after forward in fp16, hybrid sharding, tied embeddings with bf16 on gloo (GPT-2).
PRIMED = {   # name: (model, wrapping, world, the rank traced, backend)
    "thinker fsdp2 ac bf16": ("qwen3_omni_thinker", WRAPS["fsdp2 ac bf16"], 3, 2, "gloo"),
    "thinker fsdp1 layer orig": ("qwen3_omni_thinker", WrapConfig(**ORIG_LAYER), 3, 0, "nccl"),   # rank 2: no LoRA
    "moe fsdp2 no-reshard fp16": ("qwen3_moe", WRAPS["fsdp2 no-reshard fp16"], 4, 3, "nccl"),
    "llama fsdp1 sgo orig": ("llama", WRAPS["fsdp1 sgo orig"], 2, 1, "gloo"),
    "llama fsdp2 hybrid": ("llama", WRAPS["fsdp2 hybrid"], 4, 3, "gloo"),
    "gpt2 fsdp1 layer orig bf16": ("gpt2", WrapConfig(**ORIG_LAYER, mixed_precision="bf16"), 2, 1, "gloo")}

def _primed_model(name:str):
    if name == "gpt2": return case_model(dict(config=GPT2, targets=("c_attn", "c_proj"), train=True), "meta")
    moe = MOE if name in ("qwen3_moe", "qwen3_omni_thinker") else {}
    return add_lora(model_from_config(dict(shipped_config(name), **moe), device="meta"), r=8)

def _a_first_iteration(batch:int, seq:int, backend:str):
    "A stand-in for `_prime`: the first iteration run whole, untracked; it leaves no parameter to discount."
    import contextlib
    from lora_fsdp_kit.fits.trace import STAGING_BACKENDS, _cpu_rng_states, _step
    def first(wrapped, opt, cfg):
        with _cpu_rng_states() if backend in STAGING_BACKENDS else contextlib.nullcontext():
            _step(wrapped, opt, batch, seq, wrapped.get_input_embeddings().num_embeddings)
        return []
    return first

@pytest.mark.parametrize("name", list(PRIMED))
def test_the_primed_step_is_the_step_after_a_first_iteration(name, monkeypatch):
    import lora_fsdp_kit.fits.trace as T
    model, cfg, world, rank, backend = PRIMED[name]
    args = (_primed_model(model), cfg, world, rank, 2, 16, backend, "fused", "all")
    primed = trace_rank(*args)
    monkeypatch.setattr(T, "_prime", _a_first_iteration(2, 16, backend))
    real = trace_rank(*args)
    for f in ("peak", "worst_peak", "by_category", "sharded_bytes", "optimizer_bytes", "signatures"):
        assert getattr(primed, f) == getattr(real, f), (f, getattr(primed, f), getattr(real, f))
    assert [v for _, v in primed.timeline] == [v for _, v in real.timeline]   # the same bytes (FSDP1: 2 ops later)
    if "thinker" in name:   # not vacuous: the towers' LoRA gets no gradient, and without the discount the peak is off
        monkeypatch.undo(); monkeypatch.setattr(T, "_discount", lambda *a: None)
        assert trace_rank(*args).peak > real.peak

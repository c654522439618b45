"""`fits` beyond the zoo (issue 31). (1) The reduced trace (4 and 5 decoder layers, extended to L) equals the full
trace to the byte -- peak, worst peak, every category, shard and optimizer bytes, which ranks share a trace -- over a
covering array of wrappings x models x worlds x backends (that ranks of one signature trace alike is
tests/test_fits_grouping.py). (1b) The primed step (what a first iteration leaves, made without running one) is the
step after a real first iteration, to the byte. The configurations the zoo matrix of tests/test_fits.py does not hold,
on real gloo ranks (FSDP1 SHARD_GRAD_OP with use_orig_params, fp32 master weights with bf16 compute, a bf16 base with
fp32 LoRA, GPT-2 and Phi-3 built from small configs, ...), are tests/test_fits_beyond.py's `UNHELD`: one launch of
ranks there measures every real-rank case beyond the zoo."""
import functools

import pytest

from lora_fsdp_kit.fits.trace import trace_rank
from lora_fsdp_kit.fits.reduced import why_not_reduced
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

# ------------------------------------------------------------ (1b) the primed step == a step after a first iteration
# A trace runs no first iteration: `fits_trace._prime` makes what one leaves (FSDP's lazy state, FSDP2's all-gather
# outputs and unsharded parameters, AdamW's state) and `_discount` takes off the state of parameters the step gives no
# gradient. Here the trace's former way stands in for `_prime`: a whole first iteration, untracked. Rows: a unit no
# batch reaches (the Omni thinker's towers) under FSDP2 and FSDP1, FSDP1's rate limiter (SHARD_GRAD_OP), no reshard
# after forward in fp16, hybrid sharding, tied embeddings with bf16 on gloo (GPT-2).
GPT2 = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64, n_head=4, n_positions=128,
            vocab_size=256)   # Conv1D projections, tied embeddings, dropout 0.1
ORIG_LAYER = dict(flavour="fsdp1", policy="layer", use_orig_params=True)
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
    from lora_fsdp_kit.fits.step import train_step
    from lora_fsdp_kit.fits.tracker import STAGING_BACKENDS
    from lora_fsdp_kit.fits.trace import _cpu_rng_states
    def first(wrapped, opt, cfg):
        with _cpu_rng_states() if backend in STAGING_BACKENDS else contextlib.nullcontext():
            train_step(wrapped, opt, batch, seq, wrapped.get_input_embeddings().num_embeddings)
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

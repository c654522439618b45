"""The predicted peak of a LoRA training step (`lora_fsdp_kit.fits.core`: one process, fake tensors, a fake process group)
is within 1 % of every real gloo rank's measured peak (`lora_fsdp_kit.fits.steppeak`: the CPU allocator's own running total
on real ranks, every thread counted; the two share no code), across 4 architectures of the zoo x FSDP1/FSDP2 x
activation checkpointing x fp32/bf16 x worlds 2 and 3 (every pair of values, a covering array), and a Llama with tied
embeddings under FSDP1; the plan's closed
form gives the parameter-side bytes of every trace to the byte; what the trace cannot get is said in one line; and a
prediction leaves no global state behind. The full 64-configuration matrix runs in `bench/fits.py --matrix`."""
import contextlib, functools, io, multiprocessing, threading, time

import pytest
import torch
import torch.distributed as dist

from lora_fsdp_kit.__main__ import main
from lora_fsdp_kit.fits.closed_form import closed_form
from lora_fsdp_kit.fits.core import FitsError, predict_step_memory
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.fits.steppeak import measure_steps
from lora_fsdp_kit.plan.wrap import WrapConfig

BATCH, SEQ = 2, 128            # activations a real share of every peak (7-60 %), so 1 % is a test of them too
MOE = dict(experts_implementation="batched_mm")   # grouped_mm has no fp32 meta kernel (tested below)
ARCH = {"llama": {}, "qwen2": {}, "qwen3_moe": MOE, "qwen3_omni_thinker": MOE}

def wrap(flavour:str, ac:bool, bf16:bool)->WrapConfig:
    "FSDP1 with bf16 uses decoder-layer units and use_orig_params (with LoRA leaves as units it fails for real)."
    kw = dict(policy="layer", use_orig_params=True) if flavour == "fsdp1" and bf16 else {}
    return WrapConfig(flavour=flavour, activation_checkpointing=ac, mixed_precision="bf16" if bf16 else None, **kw)

# Every value of every factor, and every pair of values of two factors (architecture, flavour, checkpointing, bf16,
# world), appears at least once: a covering array, not the product. FSDP1 with bf16 (use_orig_params: every rank its
# own trace) only at world 2, where two ranks already differ; world 3 meets FSDP1 in fp32 and FSDP2 in both.
from lora_fsdp_kit.testing.core import covering_array
DIMS = dict(model=list(ARCH), flavour=["fsdp1", "fsdp2"], ac=[False, True], bf16=[False, True], world=[2, 3])
_ROWS = covering_array(DIMS, allowed=lambda r: not (r["flavour"] == "fsdp1" and r["bf16"] and r["world"] == 3))
CASES = {w: [(r["model"], r["flavour"], r["ac"], r["bf16"]) for r in _ROWS if r["world"] == w] for w in (2, 3)}
# and a Llama with tied embeddings ("+tied"): FSDP1 materialises a meta model unit by unit, where a tie is easily lost
TIED = [(2, ("llama+tied", "fsdp1", False, False)), (2, ("llama+tied", "fsdp1", False, True))]
ALL = [(w, c) for w in CASES for c in CASES[w]] + TIED

def overrides(name:str)->dict:
    "The config overrides of a case's model: its architecture's, and tied embeddings for a '+tied' name."
    base, _, extra = name.partition("+")
    return {**ARCH[base], **({"tie_word_embeddings": True} if extra == "tied" else {})}

@functools.cache   # predictions copy it, the plan only reads it (test_no_global_state_left checks it stays on meta)
def meta_model(name:str):
    return add_lora(model_from_config(dict(shipped_config(name.partition("+")[0]), **overrides(name)), device="meta"),
                    r=8)

def _global_state():
    from torch._subclasses.fake_tensor import FakeTensor
    import torch.distributed.fsdp._flat_param as flat
    return (torch.get_rng_state, torch.set_rng_state, flat._same_storage, "data_ptr" in FakeTensor.__dict__,
            torch.UntypedStorage.resize_, dist.is_initialized())

STATE = {}   # (world, case) -> (global state before, after) the prediction

@functools.cache
def predicted(world:int, case:tuple):
    m, f, ac, bf = case
    pm, before = meta_model(m), _global_state()
    out = predict_step_memory(pm, world=world, wrap=wrap(f, ac, bf), batch=BATCH, seq=SEQ, backend="gloo")
    STATE[(world, case)] = (before, _global_state(), all(p.device.type == "meta" for p in pm.parameters()))
    return out

def _launch_in_background()->tuple[threading.Thread, dict]:
    "Every case in one launch of 3 ranks (world-2 cases on ranks 0-1), run while this process traces."
    spec = [dict(model=m.partition("+")[0], overrides=overrides(m), wrap=wrap(f, ac, bf).to_dict(), batch=BATCH,
                 seq=SEQ, world=w)
            for w, (m, f, ac, bf) in ALL]
    box = {}
    def run():
        try: box["res"] = launch(measure_steps, spec, nprocs=3, quiet=True, timeout=600)
        except BaseException as e: box["error"] = e
    t = threading.Thread(target=run, daemon=True); t.start()
    # the trace makes a (fake) process group in this process; `launch` must have checked for none and spawned first
    t0 = time.monotonic()
    while not multiprocessing.active_children() and t.is_alive() and time.monotonic() - t0 < 120: time.sleep(0.05)
    return t, box

@pytest.fixture(scope="module")
def real():
    "{(world, case): [peak of rank 0, rank 1, ...]}, measured while the predictions are traced."
    t, box = _launch_in_background()
    for w, c in ALL: predicted(w, c)
    t.join()
    if "error" in box: raise box["error"]
    out = {}
    for i, (w, c) in enumerate(ALL):
        rows = [box["res"][r][i] for r in range(w)]
        errs = [r["error"] for r in rows if "error" in r]
        assert not errs, errs[0]
        assert all(r["world"] == w for r in rows) and all("skipped" in box["res"][r][i] for r in range(w, 3))
        out[(w, c)] = [r["peak"] for r in rows]
    return out

def test_matrix_covers_every_factor():
    "Every value, and every pair of values of two factors, is in the matrix (what the covering array promises)."
    import itertools
    rows = [dict(zip(DIMS, (*c, w))) for w in CASES for c in CASES[w]]
    for (d1, v1), (d2, v2) in itertools.combinations(list(DIMS.items()), 2):
        for x, y in itertools.product(v1, v2):
            assert any(r[d1] == x and r[d2] == y for r in rows), (d1, x, d2, y)
    assert any(c[1] == "fsdp1" and c[3] for c in CASES[2])   # FSDP1 with use_orig_params: ranks that differ

@pytest.mark.parametrize("world,case", ALL, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else f"w{v}")
def test_prediction_within_1_percent_of_every_real_rank(real, world, case):
    cfg, pred = wrap(*case[1:]), predicted(world, case)
    got = real[(world, case)]
    assert len(pred.peak_bytes) == world
    for r, (p, g) in enumerate(zip(pred.peak_bytes, got)):
        assert abs(p / g - 1) <= 0.01, f"rank {r}: predicted {p:,}, measured {g:,} ({p / g - 1:+.3%}) {cfg.label}"
    # the trace accounts for its peak: the categories add up, and the peak is in a phase of the step
    assert all(sum(c.values()) == p for c, p in zip(pred.by_category, pred.peak_bytes))
    assert all(ph in ("forward", "backward", "optimizer step") for ph in pred.peak_phase)

def test_fsdp1_orig_params_ranks_differ_and_each_matches(real):
    "FSDP1 with use_orig_params cuts LoRA tensors differently per rank: the traces follow each rank."
    for w in CASES:
        for case in (c for c in CASES[w] if c[1] == "fsdp1" and c[3]):
            pred, got = predicted(w, case), real[(w, case)]
            assert len(pred.traces) == w and len(set(pred.peak_bytes)) > 1
            assert max(range(w), key=pred.peak_bytes.__getitem__) == max(range(w), key=got.__getitem__)

@pytest.mark.parametrize("world,case", ALL, ids=lambda v: "-".join(map(str, v)) if isinstance(v, tuple) else f"w{v}")
def test_closed_form_agrees_with_the_trace(world, case):
    pred, pm, under = predicted(world, case), meta_model(case[0]), []
    for t in pred.traces:
        cf = closed_form(pm, wrap(*case[1:]), world, t.rank)
        assert cf == pred.closed_form[t.rank]
        assert t.sharded_bytes == cf["sharded"]
        # AdamW makes state only for parameters that got a gradient: the thinker's audio and vision towers run on no
        # text batch, so there the closed form (every trainable parameter) is an upper bound
        if case[0] != "qwen3_omni_thinker": assert t.optimizer_bytes == cf["optimizer"]
        else: assert t.optimizer_bytes <= cf["optimizer"]; under.append(t.optimizer_bytes < cf["optimizer"])
        # the unsharded parameters live at the peak are whole units of the plan
        sums = {0}
        for b in cf["unsharded"].values(): sums |= {s + b for s in sums}
        assert t.by_category["unsharded parameters"] in sums, (t.by_category, sorted(cf["unsharded"].values()))
    assert any(under) == (case[0] == "qwen3_omni_thinker")

def test_closed_form_follows_fsdp1_alignment_under_mixed_precision():
    """FSDP1 with use_orig_params aligns each tensor to 16 bytes of the dtype it unshards to: 8 elements under bf16. A
    LoRA tensor of 3 elements (r=3 on the shared expert's 1-wide gate) shows it; the closed form follows the trace."""
    from lora_fsdp_kit.fits.trace import trace_rank
    odd = add_lora(model_from_config(dict(shipped_config("qwen2_moe"), **MOE), device="meta"),
                   r=3, target_modules=("q_proj", "shared_expert_gate"))
    sharded = {}
    for mp in (None, "bf16"):
        cfg = WrapConfig(flavour="fsdp1", policy="layer", use_orig_params=True, mixed_precision=mp)
        t, cf = trace_rank(odd, cfg, 3, 2, batch=1, seq=8), closed_form(odd, cfg, 3, 2)
        assert (t.sharded_bytes, t.optimizer_bytes) == (cf["sharded"], cf["optimizer"]), (mp, t.sharded_bytes, cf)
        sharded[mp] = t.sharded_bytes
    assert sharded["bf16"] > sharded[None], sharded   # more alignment padding under bf16

def test_a_tied_bias_under_its_second_name():
    """BERT-style heads tie `cls.predictions.decoder.bias` to `cls.predictions.bias`: `named_parameters()` gives it once,
    under its first name, and the FSDP2 plan's unit may hold it under the second (a KeyError in 15 rows of the sweep:
    big_bird, ernie, megatron-bert, roc_bert; bert-generation's `lm_head.decoder.bias`). Traced and closed form agree."""
    from transformers import ErnieConfig
    cfg = ErnieConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=128,
                      is_decoder=True, architectures=["ErnieForCausalLM"])
    pm = add_lora(model_from_config(cfg, device="meta"), target_modules=("query", "value"))
    named = {n for n, _ in pm.named_parameters()}
    assert not any(n.endswith("cls.predictions.decoder.bias") for n in named)   # the case: only its first name
    m = predict_step_memory(pm, world=2, wrap=WrapConfig(flavour="fsdp2"), seq=16)
    for t in m.traces:
        assert (t.sharded_bytes, t.optimizer_bytes) == (m.closed_form[t.rank]["sharded"], m.closed_form[t.rank]["optimizer"])

def test_what_cannot_be_predicted_is_one_line():
    grouped = add_lora(model_from_config(shipped_config("qwen3_moe"), device="meta"))   # grouped_mm, fp32
    with pytest.raises(FitsError, match="no float32 meta kernel") as e: predict_step_memory(grouped, world=2, seq=8)
    assert "\n" not in str(e.value)
    eager = add_lora(model_from_config(dict(shipped_config("qwen3_moe"), experts_implementation="eager"),
                                       device="meta"))
    with pytest.raises(FitsError, match="data-dependent shapes") as e: predict_step_memory(eager, world=2, seq=8)
    assert "\n" not in str(e.value)

def test_no_global_state_left():
    "Every prediction of the matrix (and a failing one) leaves torch as it found it, the model on meta."
    case = next(c for c in CASES[2] if c[1] == "fsdp1" and c[2])   # FSDP1 with activation checkpointing
    predicted(2, case)
    before = _global_state()
    with pytest.raises(FitsError): predict_step_memory(add_lora(model_from_config(shipped_config("qwen3_moe"),
                                                                                  device="meta")), world=2, seq=8)
    assert _global_state() == before and not before[-1]
    for key, (b, a, meta) in STATE.items(): assert b == a and meta, key

def test_cli_bad_input_is_one_line_exit_2():
    for argv, text in ((["--world", "8", "--device-memory", "80 Go"], "cannot read '80 Go'"),
                       (["--world", "0", "--device-memory", "80GiB"], "--world must be 1-1024"),
                       (["--world", "8", "--device-memory", "80GiB", "--mixed-precision", "fp8"],
                        "--mixed-precision takes none, bf16, bfloat16, fp16, float16; got 'fp8'"),
                       (["--world", "8", "--device-memory", "80GiB", "--activation-checkpointing", "maybe"],
                        # its words name the implementations: off, on (= wrapper), wrapper, hf
                        "activation_checkpointing must be False ('off'), 'wrapper' (True, 'on'"),
                       # said as a step that fails (exit 1, which a CI gate reads as "does not fit") until checked here
                       (["--world", "4", "--device-memory", "80GiB", "--sharding", "HYBRID", "--shard-size", "3"],
                        "world size 4 does not split into shard groups of 3"),
                       (["--world", "2", "--device-memory", "80GiB", "--layer-cls", "NoSuchLayer"],
                        "unknown layer class 'NoSuchLayer'")):
        err = io.StringIO()
        with contextlib.redirect_stderr(err): rc = main(["fits", "--config", "llama", *argv])
        assert rc == 2 and text in err.getvalue() and err.getvalue().count("\n") == 1, err.getvalue()

# ---- the answer users read: precision as they set it, the wrap flags, the rows, the gate, the largest batch ----
from lora_fsdp_kit.fits.report import fits_report
from lora_fsdp_kit.units import fmt_bytes
from lora_fsdp_kit.shards import clean_name
from lora_fsdp_kit.testing.core import covering_array

def _report(**kw)->tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = fits_report(**kw)
    return rc, out.getvalue(), err.getvalue()

def test_param_dtype_changes_the_parameter_bytes_exactly():
    "fp32 master weights vs bf16 storage of a bf16 config, both computed in bf16: the shards and AdamW's moments are 2x."
    pm = add_lora(model_from_config(dict(shipped_config("llama"), dtype="bfloat16"), device="meta"))
    kw = dict(world=2, seq=16, mixed_precision="bf16")
    m32, m16 = (predict_step_memory(pm, param_dtype=d, **kw) for d in ("fp32", "config"))
    steps = 4 * sum(p.requires_grad for p in pm.parameters())   # AdamW's step: one fp32 scalar per tensor, any dtype
    for a, b in zip(m32.by_category, m16.by_category):
        assert a["sharded parameters"] == 2 * b["sharded parameters"] > 0
        assert a["optimizer state"] - steps == 2 * (b["optimizer state"] - steps) > 0
        assert a["unsharded parameters"] == b["unsharded parameters"]             # gathered in bf16 either way
    assert "stored in fp32 (param_dtype)" in m32.assumptions
    assert "stored in bf16 (config.json's torch_dtype)" in m16.assumptions
    assert "computed in bf16 (FSDP mixed precision), gradients reduced in fp32" in m16.assumptions
    assert {p.dtype for p in pm.parameters()} == {torch.bfloat16, torch.float32}   # the model given: untouched

def test_max_seq_stops_at_a_learned_position_table(tmp_path):
    # GPT-2 holds 128 positions: the search's probes past them were traced and given numbers (the step raises
    # IndexError on the devices), and now refused; the search stops at the table
    import json
    cfg = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=2, n_embd=64, n_head=4, n_positions=128,
               vocab_size=256, bos_token_id=0, eos_token_id=0)
    (tmp_path/"config.json").write_text(json.dumps(cfg))
    rc, out, err = _report(config=str(tmp_path/"config.json"), targets="c_attn", world=2, device_memory="80GiB",
                           wraps=[WrapConfig(flavour="fsdp2")], batch="1", max_seq=True)
    assert rc == 0 and "largest seq 128 (the search stops there: the model's context)" in out, out + err

def test_max_seq_stops_at_a_rope_models_context(tmp_path):
    "A RoPE model has no table to outrun, but past max_position_embeddings it was never trained: the search stops."
    import json
    cfg = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=64, intermediate_size=128,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
               max_position_embeddings=96)
    (tmp_path/"config.json").write_text(json.dumps(cfg))
    rc, out, err = _report(config=str(tmp_path/"config.json"), world=2, device_memory="80GiB",
                           wraps=[WrapConfig(flavour="fsdp2")], batch="1", max_seq=True)
    assert rc == 0 and "largest seq 96 (the search stops there: the model's context)" in out, out + err

def test_max_batch_the_peak_at_n_fits_and_at_n_plus_1_does_not():
    """A device sized from a trace (batch 2's peak, plus 1 byte): the search answers 2, with that very peak, and a
    peak at 3 beyond the device; exit 0; the header counts the real model's parameters; every row is <= 100 columns."""
    case = next(c for c in CASES[2] if c[0] == "llama")
    peak2 = predicted(2, case).worst_case   # the verdict counts the worst case (gloo: a late-freed all-gather output)
    rc, out, err = _report(config="llama", world=2, device_memory=peak2 + 1, reserve=0, wraps=[wrap(*case[1:])],
                           seq=str(SEQ), backend="gloo", max_batch=True, verbose=True)
    assert rc == 0, out + err
    line = next(l for l in out.splitlines() if "largest batch" in l)
    assert f"largest batch 2: peak {fmt_bytes(peak2)}; at 3: " in line, out
    at3 = float(line.split("at 3: ")[1].split()[0])
    assert at3 * 1024 ** ["B", "KiB", "MiB", "GiB"].index(line.split("at 3: ")[1].split()[1]) > peak2 + 1
    real = model_from_config(shipped_config("llama"), device="cpu")   # the header's count is the real model's
    assert f"{sum(p.numel() for p in real.parameters()):,} parameters" in out.splitlines()[0], out
    n_lora = sum(p.numel() for n, p in meta_model("llama").named_parameters() if "lora_" in n)
    assert f"LoRA {n_lora:,} (r=8" in out.splitlines()[0]
    lines = out.splitlines()
    k = next(i for i, l in enumerate(lines) if l.startswith("#  setting"))
    assert all(len(r) <= 100 for r in lines[k:k + 2]) and lines[k + 1].rstrip().endswith("fits"), lines[k:k + 2]
    assert "peak in " in out and "sharded parameters" in out      # --verbose: every category, module and phase

def test_gate_exit_1_when_one_does_not_fit_or_cannot_be_predicted():
    "A setting over the device, and one FSDP refuses: exit 1, the row says NO, the refusal is one line naming a flag."
    refused = WrapConfig(flavour="fsdp1", policy="lora", mixed_precision="bf16")   # LoRA leaves, bf16: fails
    from lora_fsdp_kit.__main__ import flag_language as speak   # the command line's words for the fixes
    rc, out, err = _report(config="llama", world=2, device_memory="64KiB", reserve="0B", seq="16",
                           wraps=[WrapConfig(), refused], speak=speak)
    assert rc == 1, out + err
    assert any(l.rstrip().endswith(" NO") and "-" in l for l in out.splitlines()), out
    lines = [l for l in out.splitlines() if l.startswith("cannot predict")]
    assert len(lines) == 1 and len(lines[0]) <= 160 and "fix: keep LoRA inside the layer units" in lines[0], lines
    assert "--policy layer" in lines[0] or "--no-lora-leaves" in lines[0]

def test_a_refusal_that_depends_on_the_world_size():
    "FSDP2 on dim 1: 64 rows divide over 2 ranks, not over 3 (torch refuses at fully_shard); said before any trace."
    cfg = WrapConfig(shard_dim=1)
    with pytest.raises(FitsError, match=r"uneven-shard-dim.*fix: shard_dim=0, or a shard group that divides 64") as e:
        predict_step_memory(meta_model("llama"), world=3, wrap=cfg, seq=16)
    assert "\n" not in str(e.value)

def _wrap_or_none(row:dict):
    try: return WrapConfig(**{k: v for k, v in row.items() if k != "param_dtype"})
    except ValueError: return None   # a combination WrapConfig refuses (e.g. use_orig_params on FSDP2)

WRAP_DIMS = dict(flavour=["fsdp1", "fsdp2"], policy=["layer", "lora"], use_orig_params=[False, True],
                 mixed_precision=[None, "bf16"], activation_checkpointing=[False, True],
                 sharding=[None, "SHARD_GRAD_OP", "HYBRID"], reshard_after_forward=[True, False],
                 lora_leaves=[True, False], param_dtype=["fp32", "bf16"])
ROWS = covering_array(WRAP_DIMS, allowed=lambda r: _wrap_or_none(r) is not None and (
    r["flavour"] == "fsdp1" or not r["use_orig_params"]))
@pytest.mark.parametrize("row", ROWS, ids=lambda r: "-".join(str(v) for v in r.values()))
def test_every_wrapping_the_plan_accepts_is_predicted(row):
    """The wrap flags, every pair of their values (a covering array, not the product): predicted (the last rank: it
    holds the padding), or refused in one line naming the flag, exactly where the plan finds an error."""
    from lora_fsdp_kit.__main__ import flag_language
    from lora_fsdp_kit.fits.report import _one_line
    cfg, pm, world = _wrap_or_none(row), meta_model("llama"), 4 if row["sharding"] == "HYBRID" else 2
    errors = [f for f in cfg.plan(pm).check() if f.severity == "error"]
    try: mem = predict_step_memory(pm, world=world, wrap=cfg, seq=16, param_dtype=row["param_dtype"], rank=world - 1)
    except FitsError as e:
        assert errors, f"the plan accepts {cfg.label}, the prediction refuses it: {e}"
        line = _one_line(cfg.label, e, flag_language)
        assert len(line) <= 160 and "; fix: " in line and "--" in line.split("; fix: ")[1], line
        return
    assert not errors, f"the plan refuses {cfg.label} ({errors[0].check}), the prediction does not"
    assert mem.ranks == (world - 1,) and mem.worst > 0

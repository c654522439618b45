"""The plan is what FSDP does: on 2 gloo ranks (and 3 for the forward/backward cases), the units planned by `WrapConfig.plan` (names, exact parameter sets, and each parameter's shape and dtype in FSDP's order) equal the units of the model really wrapped by `WrapConfig.wrap`, read back through the kit's sharded view, for 4 LoRA models (a Qwen3-MoE with LoRA on its fused experts too, and one with LoRA on its routers' 2-D weights; a bf16 one with fp32 adapters; tied embeddings, mixed precision, DoRA and modules_to_save run forward and backward) × wrap policies × use_orig_params and FSDP2 target choices; where FSDP refuses (at wrap, first forward or backward), a registered check predicted it (the error texts come from `checks.CHECKS`), at the unit where FSDP stopped (FSDP2 sharding dim 1 over 3 ranks included: a plan made under the ranks knows the world); where it runs, the plan has no error finding."""
import functools, time

import pytest

from lora_fsdp_kit.testing import fidelity as F
from lora_fsdp_kit.plan.checks import CHECKS, predicted_by, predicted_errors
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.testing.core import covering_array
from lora_fsdp_kit.testing.toys import moe_lora_model, own_and_child_params_model
from lora_fsdp_kit.models import tiny_lora_model
from lora_fsdp_kit.plan.wrap import WrapConfig

MODELS = ("llama", "qwen2", "qwen3_moe", "qwen3_omni_thinker")   # tiny models of the kit's zoo
# FSDP's errors (at construction, first forward or backward) -> the check that predicts each: from the registry
PREDICTS = predicted_errors()
fsdp1 = functools.partial(WrapConfig, flavour="fsdp1")
fsdp2 = functools.partial(WrapConfig, flavour="fsdp2")
LAYERS = fsdp2(targets="**.layers.*")


KINDS = ("peft", "lora", "guarded", "layer", "size-small", "size-large", "fsdp2-layers", "fsdp2-leaves")

def _config(kind:str, uop:bool, numel:int)->WrapConfig:
    "One wrapping of the matrix; size thresholds relative to the model so each wraps several units."
    small, large = _sizes(numel)
    return {"peft": lambda: fsdp1(policy="peft", use_orig_params=uop),                        # peft's preset
            "lora": lambda: fsdp1(policy="lora", use_orig_params=uop),                        # lambda | layer
            "guarded": lambda: fsdp1(policy="lora", min_num_params=small, use_orig_params=uop),  # layer | size
            "layer": lambda: fsdp1(policy="layer", use_orig_params=uop),                      # layer-only
            "size-small": lambda: fsdp1(policy="size", min_num_params=small, use_orig_params=uop),  # size-only,
            "size-large": lambda: fsdp1(policy="size", min_num_params=large, use_orig_params=uop),  # two sizes
            "fsdp2-layers": lambda: LAYERS,                                                    # decoder layers
            "fsdp2-leaves": lambda: fsdp2(targets=["**.lora_A.*", "**.lora_B.*", "**.layers.*"]),  # + LoRA leaves
            }[kind]()

# The matrix (4 models x 6 FSDP1 policies x use_orig_params, + 2 FSDP2 target sets: 56 wrappings) sampled as a
# pairwise covering array: every model, policy and use_orig_params value, and every pair of them, at least once (FSDP2
# has no use_orig_params). Each model's peft preset with flat parameters comes first: it wraps on every model, so each
# model is seen wrapped with both use_orig_params settings.
MATRIX = covering_array(dict(model=MODELS, kind=KINDS, uop=[False, True]),
                        allowed=lambda r: not (r["kind"].startswith("fsdp2") and r["uop"]),
                        must=[dict(model=m, kind="peft", uop=False) for m in MODELS])


def _sizes(numel:int)->tuple[int, int]: return max(numel // 40, 1000), max(numel // 6, 1000)


def _mts_sizes()->tuple[int, int]:
    "Size thresholds for tied embeddings + modules_to_save: `large` is the embedding's size (a unit of its own)."
    m = tiny_lora_model("llama", config_overrides=dict(tie_word_embeddings=True), device="meta",
                        lora_kwargs=dict(modules_to_save=["lm_head"]))
    return _sizes(sum(p.numel() for p in m.parameters()))[0], m.base_model.model.model.embed_tokens.weight.numel()


def _forward_cases()->list:
    "Cases that FSDP accepts at wrap time and may refuse at the first forward or backward (run on 2 and 3 ranks)."
    tied = functools.partial(tiny_lora_model, "llama", config_overrides=dict(tie_word_embeddings=True))
    llama = functools.partial(tiny_lora_model, "llama")
    dora = functools.partial(tiny_lora_model, "llama", lora_kwargs=dict(use_dora=True))
    mts = functools.partial(tiny_lora_model, "llama", config_overrides=dict(tie_word_embeddings=True),
                            lora_kwargs=dict(modules_to_save=["lm_head"]))
    fw = lambda label: dict(model=label, forward=True)
    return ([(llama, c, fw("llama_mp")) for c in (
                fsdp1(policy="lora", use_orig_params=False, mixed_precision="bf16"),  # LoRA leaves: forward fails
                fsdp1(policy="lora", use_orig_params=True, mixed_precision="bf16"),
                fsdp1(policy="layer", use_orig_params=True, mixed_precision="bf16"),  # LoRA inside layers: fine
                fsdp1(policy="lora", lora_leaves=False, use_orig_params=True, mixed_precision="bf16"),
                fsdp2(targets="**.layers.*", mixed_precision="bf16"))]
            + [(dora, c, fw("llama_dora")) for c in (
                fsdp1(policy="lora", use_orig_params=True),                # LoRA leaves: IndexError
                fsdp1(policy="lora", use_orig_params=False),               # fine
                fsdp1(policy="layer", use_orig_params=True),
                LAYERS)]
            + [(tied, c, fw("llama_tied")) for c in (
                fsdp1(policy="lora", layer_cls=["Embedding"], use_orig_params=False),  # the head gets its own copy
                fsdp1(policy="lora", layer_cls=["Embedding"], use_orig_params=True))]  # the head reads a shard
            + [(mts, c, fw("llama_tied_mts")) for c in (
                fsdp1(policy="lora", use_orig_params=True), fsdp1(policy="lora", use_orig_params=False),
                fsdp1(policy="peft", use_orig_params=True), LAYERS,
                # issue 19: the tied original head does not run; with `large` its unit exists on one rank only
                fsdp1(policy="size", min_num_params=_mts_sizes()[0], use_orig_params=True),
                fsdp1(policy="size", min_num_params=_mts_sizes()[1], use_orig_params=True),
                fsdp1(policy="lora", min_num_params=_mts_sizes()[0], use_orig_params=True))])


def _features(case:tuple)->dict:
    "What a forward case varies: the model, the FSDP1 policy (or FSDP2), use_orig_params, mixed precision."
    _, cfg, opts = case
    return dict(model=opts["model"], policy=cfg.policy if cfg.flavour == "fsdp1" else "fsdp2",
                uop=bool(cfg.use_orig_params), mp=str(cfg.mixed_precision))


def _three_rank_cases()->list:
    """The forward cases again on 3 ranks, sampled: every value of every feature on 3 ranks as on 2 (the pairs of
    features are all on 2 ranks, which run every case); and always the two refusals (mixed precision on flat LoRA
    leaves, DoRA on LoRA-leaf units) and the tied head at the embedding's size, a unit on one rank of 2, none of 3."""
    cases = _forward_cases()
    feats = [_features(c) for c in cases]
    key = lambda r: tuple(r[k] for k in feats[0])
    big = _mts_sizes()[1]
    always = [c for c, f in zip(cases, feats) if c[1].min_num_params == big or f["policy"] == "lora" and (
              (f["model"], f["uop"]) in {("llama_mp", False), ("llama_dora", True)} and c[1].lora_leaves)]
    dims = {k: sorted({f[k] for f in feats}, key=str) for k in feats[0]}
    rows = covering_array(dict(world=[2, 3], **dims), allowed=lambda r: key(r) in {key(f) for f in feats},
                          must=[dict(f, world=2) for f in feats] + [dict(_features(c), world=3) for c in always])
    picked = {key(r) for r in rows if r["world"] == 3} - {key(_features(c)) for c in always}
    return always + [next(c for c, f in zip(cases, feats) if key(f) == k) for k in sorted(picked, key=str)]


@pytest.fixture(scope="module")
def results():
    numel = {m: sum(p.numel() for p in tiny_lora_model(m, device="meta").parameters()) for m in MODELS}
    cases = [(functools.partial(tiny_lora_model, r["model"]), _config(r["kind"], r["uop"], numel[r["model"]]),
              dict(model=r["model"])) for r in MATRIX]
    # bf16 base with peft's fp32 adapters: LoRA-leaf units are fine, layer units mix dtypes
    bf16 = functools.partial(tiny_lora_model, "llama", dtype="bfloat16")
    cases += [(bf16, c, dict(model="llama_bf16")) for c in (
        fsdp1(policy="peft"), fsdp1(policy="lora", use_orig_params=True), fsdp1(policy="layer", use_orig_params=True),
        fsdp1(policy="lora", min_num_params=3000, use_orig_params=True), LAYERS)]
    # tied input/output embeddings, with one forward: split across units, FSDP fails when it runs
    tied = functools.partial(tiny_lora_model, "llama", config_overrides=dict(tie_word_embeddings=True))
    cases += [(tied, c, dict(model="llama_tied", forward=True)) for c in (
        fsdp1(policy="layer", layer_cls=["Embedding"], use_orig_params=True),   # embedding unit, head in the root
        fsdp1(policy="size", min_num_params=3000, use_orig_params=True),        # embedding and head: sibling units
        fsdp1(policy="lora", use_orig_params=True),                             # both in the root: fine
        fsdp2(targets=["**.embed_tokens", "**.lm_head"]),                       # two groups
        # one group, fully_shard([embed_tokens, lm_head]), as accelerate's FSDP2 shards a tied model: fine
        fsdp2(targets=["**.layers.*", "**.embed_tokens"], wrap_lm_head=True, tie_group=True),
        LAYERS)]                                                                # both in the root: fine
    cases += _forward_cases()
    # LoRA on fused experts (peft ParamWrapper, issue 18's six rows): only FSDP2 with the layers as units runs
    fused = functools.partial(moe_lora_model, "qwen3_moe_fused")
    cases += [(fused, c, dict(model="qwen3_moe_fused", forward=True)) for c in (
        fsdp1(policy="peft", use_orig_params=True), fsdp1(policy="peft"),             # split / flat view
        fsdp2(targets=["**.lora_A.*", "**.lora_B.*", "**.layers.*"]),                 # adapters sharded apart
        fsdp1(policy="layer", use_orig_params=True), fsdp1(policy="layer", use_orig_params=False),   # view / refused
        LAYERS)]   # trains
    # LoRA on the router's 2-D weight (a ParamWrapper too: peft's "all-linear" adds it on transformers 5's MoE models):
    # with its adapters in units apart FSDP1 fails otherwise than on the 3-D experts
    router = functools.partial(tiny_lora_model, "qwen3_moe", lora_kwargs=dict(target_parameters=["mlp.gate.weight"]))
    cases += [(router, c, dict(model="qwen3_moe_router", forward=True)) for c in (
        fsdp1(policy="peft", use_orig_params=True), fsdp1(policy="peft"), fsdp1(policy="layer", use_orig_params=True),
        fsdp2(targets=["**.lora_A.*", "**.lora_B.*", "**.layers.*"]), LAYERS)]
    # the rest of WrapConfig, wrapped for real and run forward and backward: each must run as planned
    llama = functools.partial(tiny_lora_model, "llama")
    cases += [(llama, c, dict(model="llama_wrap", forward=True)) for c in (
        fsdp2(shard_dim=1), fsdp2(activation_checkpointing=True, wrap_lm_head=True, reshard_after_forward=False),
        fsdp1(policy="lora", use_orig_params=True, activation_checkpointing=True, wrap_lm_head=True),
        fsdp1(policy="layer", use_orig_params=True, sharding="SHARD_GRAD_OP", mixed_precision="bf16"))]
    cases += [(bf16, c, dict(model="llama_bf16_aligned", forward=True)) for c in (
        fsdp1(policy="layer", use_orig_params=True, align_lora_dtype=True), fsdp2(align_lora_dtype=True))]
    # a unit with its own parameter beside its child modules (CLIP's embeddings): FSDP2 orders it as this torch walks
    cases += [(own_and_child_params_model, c, dict(model="own_and_child"))
              for c in (LAYERS, fsdp1(policy="layer", use_orig_params=False))]
    t0 = time.perf_counter()
    res = {2: launch(F.fidelity_check, cases, quiet=True, timeout=300)}
    t1 = time.perf_counter()
    # and the one refusal that depends on the world: FSDP2 sharding dim 1 of the tiny Llama's 64 columns over 3 ranks
    three = _three_rank_cases() + [(llama, fsdp2(shard_dim=1), dict(model="llama_uneven"))]
    res[3] = launch(F.fidelity_check, three, nprocs=3, quiet=True, timeout=240)
    print(f"{len(cases)} configurations on 2 ranks in {t1 - t0:.1f} s, {len(three)} on 3 ranks in "
          f"{time.perf_counter() - t1:.1f} s")
    return res


def _label(r): return f"{r['case']['model']}: {r['label']}"


def _all(results): return results[2][0] + results[3][0]


def _failure(error):
    "The check an FSDP error stands for (the message's numbers differ by rank where shards differ), or the error."
    return None if error is None else predicted_by(error) or error


def test_all_ranks_agree(results):
    for world, ranks in results.items():
        key = [[(r["planned"], r["wrapped"], _failure(r["error"])) for r in rk] for rk in ranks]
        for rank, k in enumerate(key[1:], 1):
            diff = [_label(r) for r, a, b in zip(ranks[0], key[0], k) if a != b]
            assert not diff, f"{world} ranks: rank {rank} differs from rank 0 in {diff}"


def test_three_ranks_as_two(results):
    "Where FSDP refuses or runs does not depend on the world size here, and neither does the plan, but for FSDP2 on dim 1."
    two = {_label(r): (r["planned"], r["error"] is None) for r in results[2][0]}
    uneven = [r for r in results[3][0] if r["case"]["model"] == "llama_uneven"]   # runs on 2 ranks (llama_wrap)
    assert len(uneven) == 1 and "does not support uneven sharding" in uneven[0]["error"], uneven
    for r in results[3][0]:
        if r not in uneven: assert two[_label(r)] == (r["planned"], r["error"] is None), _label(r)


def test_forward_cases_outcomes(results):
    "The measured behaviour each forward case stands for (so the matrix keeps covering a refusal and a run)."
    got = {(r["case"]["model"], r["config"]["policy"], r["config"].get("use_orig_params", False)): r["error"]
           for r in results[2][0] if r["case"]["model"] in ("llama_mp", "llama_dora")}
    assert "same dtype" in got[("llama_mp", "lora", False)] and got[("llama_mp", "layer", True)] is None
    assert "IndexError" in got[("llama_dora", "lora", True)] and got[("llama_dora", "lora", False)] is None
    copy = next(r for r in results[2][0] if r["case"]["model"] == "llama_tied" and r["config"].get("layer_cls")
                == ["Embedding"] and r["config"]["policy"] == "lora" and not r["config"].get("use_orig_params"))
    assert copy["error"] is None and "base_model.model.lm_head.weight" in dict(copy["wrapped"])[""]
    assert [f["check"] for f in copy["findings"] if f["severity"] == "warning" and f["check"].startswith("tied")] == \
        ["tied-param-copied"]


def test_tied_head_in_modules_to_save(results):
    """Issue 19: tied embeddings + modules_to_save run forward and backward; the plan lists exactly FSDP's units and
    calls the split a warning (the original head does not run), not an error."""
    mts = [r for r in _all(results) if r["case"]["model"] == "llama_tied_mts"]
    assert len([r for r in results[2][0] if r["case"]["model"] == "llama_tied_mts"]) == 7
    for r in mts:
        assert r["error"] is None, (_label(r), r["error"])
        assert r["wrapped"] == r["planned"], _label(r)
        assert not [f for f in r["findings"] if f["severity"] == "error"], (_label(r), r["findings"])
    split = [r for r in mts if any(f["check"] == "tied-param-split" for f in r["findings"])]
    assert split and all(f["severity"] == "warning" and "disable_adapter" in f["message"]
                         for r in split for f in r["findings"] if f["check"] == "tied-param-split")
    # at the embedding's size the original head is a unit on one rank, not on more: the plan follows the world
    big = [r for r in mts if r["config"].get("min_num_params") == _mts_sizes()[1]]
    assert big and all("base_model.model.lm_head.original_module" not in dict(r["planned"]) for r in big)


def test_tied_group_is_one_unit(results):
    "The tied embedding and head in one FSDP2 group (`tie_group`): one unit, as planned, and it runs forward and back."
    got = [r for r in _all(results) if r["case"]["model"] == "llama_tied" and r["config"].get("tie_group")]
    assert got
    for r in got:
        assert r["error"] is None and r["stage"] == "backward", (_label(r), r["error"])
        assert r["wrapped"] == r["planned"] and r["wrapped_params"] == r["planned_params"], _label(r)
        own = dict(r["wrapped"])["base_model.model.model.embed_tokens"]   # the group's unit, named by its first module
        assert own == ["base_model.model.model.embed_tokens.weight"] and "base_model.model.lm_head" not in dict(
            r["wrapped"]), _label(r)
        assert not [f for f in r["findings"] if f["check"].startswith("tied")], _label(r)


def test_every_wrap_setting_runs_as_planned(results):
    "shard_dim, activation checkpointing, the head as a unit, no reshard, SHARD_GRAD_OP, bf16, aligned adapters."
    got = [r for r in results[2][0] if r["case"]["model"] in ("llama_wrap", "llama_bf16_aligned")]
    assert len(got) == 6
    for r in got:
        assert r["error"] is None and r["stage"] == "backward", (_label(r), r["error"])
        assert r["wrapped"] == r["planned"] and r["wrapped_params"] == r["planned_params"], _label(r)
    head = [r for r in got if r["config"].get("wrap_lm_head")]
    assert all("base_model.model.lm_head" in dict(r["wrapped"]) for r in head)


def test_planned_units_equal_wrapped_units(results):
    wrapped = [r for r in _all(results) if r["error"] is None]
    assert len(wrapped) >= 30
    for r in wrapped:
        assert r["wrapped"] == r["planned"], _label(r)
    # every model, both flavours and both use_orig_params settings really wrapped something nested
    for m in MODELS:
        got = [r for r in wrapped if r["case"]["model"] == m]
        assert {r["config"]["flavour"] for r in got} == {"fsdp1", "fsdp2"}, m
        assert {r["config"].get("use_orig_params", False) for r in got if r["config"]["flavour"] == "fsdp1"} == \
            {False, True}, m
        assert max(len(r["wrapped"]) for r in got) > 10, m


def test_planned_params_in_fsdp_order(results):
    "Each unit's parameters: names, full shapes and dtypes in FSDP's order (flat parameter / parameter group)."
    for r in _all(results):
        if r["wrapped_params"] is not None: assert r["wrapped_params"] == r["planned_params"], _label(r)


def test_refusals_were_predicted(results):
    refused = [r for r in _all(results) if r["error"] is not None]
    assert refused, "the matrix should contain configurations FSDP refuses"
    for r in refused:
        assert not r["error"].startswith("plan:"), _label(r) + ": " + r["error"]
        check = predicted_by(r["error"])
        assert check, f"{_label(r)}: unexpected FSDP error {r['error']}"
        errors = [f for f in r["findings"] if f["severity"] == "error" and f["check"] == check]
        assert errors, f"{_label(r)}: FSDP refused ({r['error']}) but the plan predicted nothing"
        if r["stage"] == "wrap":   # FSDP stopped while wrapping: at the first unit the plan flagged
            assert errors[0]["unit"] == r["failed_at"], (_label(r), errors[0]["unit"], r["failed_at"])
    # every check that names an FSDP error is seen predicting one here: a new check needs its failing case
    seen = {predicted_by(r["error"]) for r in refused}
    assert seen == {c.id for c in CHECKS.values() if c.predicts}, seen


def test_accepted_configurations_have_no_error_findings(results):
    for r in _all(results):
        if r["error"] is None:
            assert not [f for f in r["findings"] if f["severity"] == "error" and f["check"] in PREDICTS.values()], \
                _label(r)

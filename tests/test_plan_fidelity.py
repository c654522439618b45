"""The plan is what FSDP does: on 2 gloo ranks (and 3 for the forward/backward cases), the units planned by `plan_fsdp1`/`plan_fsdp2` (names and exact parameter sets) equal the units of the really wrapped model, for 4 LoRA models (and a bf16 one with fp32 adapters; tied embeddings, mixed precision, DoRA and modules_to_save run forward and backward) × wrap policies × use_orig_params and FSDP2 target choices; where FSDP refuses (at wrap, first forward or backward), the plan's findings predicted it, at the unit where FSDP stopped; where it runs, the plan has no error finding."""
import functools, time

import pytest
import torch

from lora_fsdp_kit import plan as P
from lora_fsdp_kit.launch import launch

MODELS = {  # name -> (tiny_model name, add_lora scope)
    "llama": ("llama", None),
    "qwen2": ("qwen2", None),
    "qwen3_moe": ("qwen3_moe", None),
    "qwen3_omni_thinker": ("qwen3_omni_thinker", None),
}
# FSDP's errors (FSDP1 at construction, or at the first forward) and the finding that predicts each
PREDICTS = {"uniform `requires_grad`": "mixed-requires-grad", "uniform dtype": "mixed-dtype",
            "size mismatch": "tied-param-split",                                  # FSDP1: tied weight resharded
            "already managed by another FSDP group": "tied-param-split",          # FSDP2: tied weight in two groups
            "expected m1 and m2 to have the same dtype": "mixed-precision-lora-leaf",  # FSDP1 MixedPrecision + leaves
            "IndexError": "dora-lora-leaf"}                                       # DoRA + use_orig_params + leaves


def _configs(numel:int)->list[dict]:
    "The matrix for one model; size thresholds relative to the model so each wraps several units."
    small, large = max(numel // 40, 1000), max(numel // 6, 1000)
    out = []
    for uop in (False, True):
        out += [dict(policy="peft", layer_cls="auto", use_orig_params=uop),      # peft's preset
                dict(policy="lora", use_orig_params=uop),                        # lambda | layer (no size part)
                dict(policy="lora", min_num_params=small, use_orig_params=uop),  # guarded: layer | size
                dict(policy="layer", use_orig_params=uop),                       # layer-only
                dict(policy="size", min_num_params=small, use_orig_params=uop),  # size-only, two thresholds
                dict(policy="size", min_num_params=large, use_orig_params=uop)]
    out += [dict(flavour="fsdp2", targets="**.layers.*"),                        # decoder layers
            dict(flavour="fsdp2", targets=["**.lora_A.*", "**.lora_B.*", "**.layers.*"])]  # + every LoRA leaf
    return out


def _forward_cases()->list:
    "Cases that FSDP accepts at wrap time and may refuse at the first forward or backward (run on 2 and 3 ranks)."
    tied = functools.partial(P.tiny_lora_model, "llama", config_overrides=dict(tie_word_embeddings=True))
    llama = functools.partial(P.tiny_lora_model, "llama")
    dora = functools.partial(P.tiny_lora_model, "llama", lora_kwargs=dict(use_dora=True))
    mts = functools.partial(P.tiny_lora_model, "llama", config_overrides=dict(tie_word_embeddings=True),
                            lora_kwargs=dict(modules_to_save=["lm_head"]))
    bf16 = dict(mixed_precision="bfloat16", forward=True)
    return ([(llama, dict(c, model="llama_mp", **bf16)) for c in (
                dict(policy="lora", use_orig_params=False),               # LoRA leaves: the first forward fails
                dict(policy="lora", use_orig_params=True),
                dict(policy="layer", use_orig_params=True),               # LoRA inside the layers: fine
                dict(policy="lora", lora_leaves=False, use_orig_params=True),
                dict(flavour="fsdp2", targets="**.layers.*"))]
            + [(dora, dict(c, model="llama_dora", forward=True)) for c in (
                dict(policy="lora", use_orig_params=True),                # LoRA leaves: IndexError
                dict(policy="lora", use_orig_params=False),               # fine
                dict(policy="layer", use_orig_params=True),
                dict(flavour="fsdp2", targets="**.layers.*"))]
            + [(tied, dict(c, model="llama_tied", forward=True)) for c in (
                dict(policy="lora", layer_cls=["Embedding"], use_orig_params=False),  # the head gets its own copy
                dict(policy="lora", layer_cls=["Embedding"], use_orig_params=True))]  # the head reads a shard: fails
            + [(mts, dict(c, model="llama_tied_mts", forward=True)) for c in (
                dict(policy="lora", use_orig_params=True), dict(policy="lora", use_orig_params=False),
                dict(policy="peft", layer_cls="auto", use_orig_params=True),
                dict(flavour="fsdp2", targets="**.layers.*"))])


@pytest.fixture(scope="module")
def results():
    cases = []
    for label, (name, scope) in MODELS.items():
        build = functools.partial(P.tiny_lora_model, name, modules=scope)
        numel = sum(p.numel() for p in P.tiny_lora_model(name, modules=scope, device="meta").parameters())
        cases += [(build, dict(c, model=label)) for c in _configs(numel)]
    # bf16 base with peft's fp32 adapters: LoRA-leaf units are fine, layer units mix dtypes
    bf16 = functools.partial(P.tiny_lora_model, "llama", dtype="bfloat16")
    cases += [(bf16, dict(c, model="llama_bf16")) for c in (
        dict(policy="peft", layer_cls="auto"), dict(policy="lora", use_orig_params=True),
        dict(policy="layer", use_orig_params=True), dict(policy="lora", min_num_params=3000, use_orig_params=True),
        dict(flavour="fsdp2", targets="**.layers.*"))]
    # tied input/output embeddings, with one forward: split across units, FSDP fails when it runs
    tied = functools.partial(P.tiny_lora_model, "llama", config_overrides=dict(tie_word_embeddings=True))
    cases += [(tied, dict(c, model="llama_tied", forward=True)) for c in (
        dict(policy="layer", layer_cls=["Embedding"], use_orig_params=True),   # embedding unit, head in the root
        dict(policy="size", min_num_params=3000, use_orig_params=True),        # embedding and head: sibling units
        dict(policy="lora", use_orig_params=True),                             # both in the root: fine
        dict(flavour="fsdp2", targets=["**.embed_tokens", "**.lm_head"]),      # two groups
        dict(flavour="fsdp2", targets="**.layers.*"))]                         # both in the root: fine
    cases += _forward_cases()
    t0 = time.perf_counter()
    res = {2: launch(P.fidelity_check, cases, quiet=True, timeout=300)}
    t1 = time.perf_counter()
    res[3] = launch(P.fidelity_check, _forward_cases(), nprocs=3, quiet=True, timeout=240)
    print(f"{len(cases)} configurations on 2 ranks in {t1 - t0:.1f} s, {len(_forward_cases())} on 3 ranks in "
          f"{time.perf_counter() - t1:.1f} s")
    return res


def _label(r): return ", ".join(f"{k}={v}" for k, v in r["spec"].items())


def _all(results): return results[2][0] + results[3][0]


def _failure(error):
    "The finding an FSDP error stands for (the message's numbers differ by rank where shards differ), or the error."
    return None if error is None else next((c for msg, c in PREDICTS.items() if msg in error), error)


def test_all_ranks_agree(results):
    for world, ranks in results.items():
        key = [[(r["planned"], r["wrapped"], _failure(r["error"])) for r in rk] for rk in ranks]
        for rank, k in enumerate(key[1:], 1):
            diff = [_label(r) for r, a, b in zip(ranks[0], key[0], k) if a != b]
            assert not diff, f"{world} ranks: rank {rank} differs from rank 0 in {diff}"


def test_three_ranks_as_two(results):
    "Where FSDP refuses or runs does not depend on the world size here, and neither does the plan."
    two = {_label(r): (r["planned"], r["error"] is None) for r in results[2][0]}
    for r in results[3][0]: assert two[_label(r)] == (r["planned"], r["error"] is None), _label(r)


def test_forward_cases_outcomes(results):
    "The measured behaviour each forward case stands for (so the matrix keeps covering a refusal and a run)."
    got = {(r["spec"]["model"], r["spec"].get("policy", "fsdp2"), r["spec"].get("use_orig_params")): r["error"]
           for r in results[2][0] if r["spec"]["model"] in ("llama_mp", "llama_dora", "llama_tied_mts")}
    assert "same dtype" in got[("llama_mp", "lora", False)] and got[("llama_mp", "layer", True)] is None
    assert "IndexError" in got[("llama_dora", "lora", True)] and got[("llama_dora", "lora", False)] is None
    assert all(e is None for (m, *_), e in got.items() if m == "llama_tied_mts"), got
    copy = next(r for r in results[2][0] if r["spec"]["model"] == "llama_tied" and r["spec"].get("layer_cls")
                == ["Embedding"] and r["spec"]["policy"] == "lora" and not r["spec"]["use_orig_params"])
    assert copy["error"] is None and "base_model.model.lm_head.weight" in dict(copy["wrapped"])[""]
    assert [f["check"] for f in copy["findings"] if f["severity"] == "warning" and f["check"].startswith("tied")] == \
        ["tied-param-copied"]


def test_planned_units_equal_wrapped_units(results):
    wrapped = [r for r in _all(results) if r["error"] is None]
    assert len(wrapped) >= 30
    for r in wrapped:
        assert r["wrapped"] == r["planned"], _label(r)
    # every model, both flavours and both use_orig_params settings really wrapped something nested
    for m in MODELS:
        got = [r for r in wrapped if r["spec"]["model"] == m]
        assert {r["spec"].get("flavour", "fsdp1") for r in got} == {"fsdp1", "fsdp2"}, m
        assert {r["spec"].get("use_orig_params") for r in got if "policy" in r["spec"]} == {False, True}, m
        assert max(len(r["wrapped"]) for r in got) > 10, m


def test_refusals_were_predicted(results):
    refused = [r for r in _all(results) if r["error"] is not None]
    assert refused, "the matrix should contain configurations FSDP1 refuses"
    for r in refused:
        assert not r["error"].startswith("plan:"), _label(r) + ": " + r["error"]
        check = next((c for msg, c in PREDICTS.items() if msg in r["error"]), None)
        assert check, f"{_label(r)}: unexpected FSDP error {r['error']}"
        errors = [f for f in r["findings"] if f["severity"] == "error" and f["check"] == check]
        assert errors, f"{_label(r)}: FSDP refused ({r['error']}) but the plan predicted nothing"
        if r["stage"] == "wrap":   # FSDP stopped while wrapping: at the first unit the plan flagged
            assert errors[0]["unit"] == r["failed_at"], (_label(r), errors[0]["unit"], r["failed_at"])
    assert {c for r in refused for msg, c in PREDICTS.items() if msg in r["error"]} == set(PREDICTS.values())


def test_accepted_configurations_have_no_error_findings(results):
    for r in _all(results):
        if r["error"] is None:
            assert not [f for f in r["findings"] if f["severity"] == "error" and f["check"] in PREDICTS.values()], _label(r)

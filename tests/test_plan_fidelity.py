"""The plan is what FSDP does: on 2 gloo ranks, the units planned by `plan_fsdp1`/`plan_fsdp2` (names and exact parameter sets) equal the units of the really wrapped model, for 4 LoRA models (and a bf16 one with fp32 adapters, and one with tied embeddings run forward) × wrap policies × use_orig_params and two FSDP2 target choices; where FSDP refuses (at wrap or first forward), the plan's findings predicted it, at the unit where FSDP stopped."""
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
            "already managed by another FSDP group": "tied-param-split"}          # FSDP2: tied weight in two groups


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


@pytest.fixture(scope="module")
def results():
    cases = []
    for label, (name, scope) in MODELS.items():
        build = functools.partial(P.tiny_lora_model, name, modules=scope)
        numel = sum(p.numel() for p in P.tiny_lora_model(name, modules=scope, device="meta").parameters())
        cases += [(build, dict(c, model=label)) for c in _configs(numel)]
    # bf16 base with peft's fp32 adapters (CONTEXT point 3): LoRA-leaf units are fine, layer units mix dtypes
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
    t0 = time.perf_counter()
    res = launch(P.fidelity_check, cases, quiet=True, timeout=240)
    print(f"{len(cases)} configurations on 2 ranks in {time.perf_counter() - t0:.1f} s")
    return res


def _label(r): return ", ".join(f"{k}={v}" for k, v in r["spec"].items())


def test_both_ranks_agree(results):
    r0, r1 = results
    assert [(r["planned"], r["wrapped"], r["error"]) for r in r0] == [(r["planned"], r["wrapped"], r["error"]) for r in r1]


def test_planned_units_equal_wrapped_units(results):
    wrapped = [r for r in results[0] if r["error"] is None]
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
    refused = [r for r in results[0] if r["error"] is not None]
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
    for r in results[0]:
        if r["error"] is None:
            assert not [f for f in r["findings"] if f["severity"] == "error" and f["check"] in PREDICTS.values()], _label(r)

"""A flavour name means one wrapping everywhere: `WrapConfig(flavour=f)` in Python, `job.default_wrap(f)`, `Job.of`
and the command line's `--flavour f` (no other wrap flag) give equal `WrapConfig`s, for both flavours, and the
LoRA-leaf policies keep `use_orig_params` off unless it is given."""
import argparse

import pytest

from lora_fsdp_kit.cli_wrap import add_wrap_flags, wrap_config_of
from lora_fsdp_kit.plan import wrap
from lora_fsdp_kit.plan.job import FLAVOUR_DEFAULTS, Job, default_wrap
from lora_fsdp_kit.plan.wrap import WrapConfig

def cli(*flags:str)->WrapConfig:
    p = argparse.ArgumentParser(); add_wrap_flags(p)
    return wrap_config_of(p.parse_args(list(flags)))

@pytest.mark.parametrize("flavour", ["fsdp1", "fsdp2"])
def test_one_meaning(flavour):
    py = WrapConfig(flavour=flavour)
    assert py == default_wrap(flavour) == Job.of(model="llama", flavour=flavour).wrap == cli("--flavour", flavour)
    assert py.policy == "layer" and py.use_orig_params == (flavour == "fsdp1"), py

@pytest.mark.parametrize("policy,orig", [("lora", False), ("peft", False), ("layer", True), ("root", True)])
def test_policy_decides_orig(policy, orig):
    py = WrapConfig(flavour="fsdp1", policy=policy)
    assert py.use_orig_params is orig
    assert py == default_wrap("fsdp1", policy=policy) == cli("--flavour", "fsdp1", "--policy", policy)
    assert WrapConfig(flavour="fsdp1", policy=policy, use_orig_params=not orig).use_orig_params is (not orig)

def test_one_table():
    assert FLAVOUR_DEFAULTS == wrap.FLAVOUR_DEFAULTS

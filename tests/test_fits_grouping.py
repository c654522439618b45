"""Ranks grouped by signature trace alike, to the byte: `predict_step_memory` traces one rank per signature, and
here ranks of each group are traced on their own over a covering array of wrappings x Llama, Qwen3-MoE, Qwen2 x
worlds 3 and 8 x gloo/NCCL. A file of its own (it was a part of tests/test_fits_accuracy.py): under `--dist loadfile`
a worker takes a whole file, and the two halves run side by side."""
import functools

import pytest

from lora_fsdp_kit.fits.trace import rank_signatures, trace_many
from lora_fsdp_kit.models import add_lora, model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.testing.core import covering_array
from lora_fsdp_kit.plan.wrap import WrapConfig
from test_fits_accuracy import MOE, WRAPS   # the wrappings and the MoE kernel of the reduced-trace matrix

# `predict_step_memory` traces one rank per signature (`fits_trace._signatures`; FSDP1 with use_orig_params: the
# lengths of a rank's pieces of the TRAINABLE parameters, a frozen piece being a view of the shard with no bytes of its
# own; FSDP2: the rows of every shard, frozen ones too: an empty frozen shard moves bytes between categories, which
# the fsdp2-qwen3_moe-8 row caught). Here ranks are traced on their own, and ranks of one signature must agree to the
# byte: peak, worst peak, every category, shard and optimizer bytes. Of each group of several ranks: its first (the
# rank `predict_step_memory` traces), its second and its last: at world 3 every rank of a group, at world 8 a group's
# middle ranks are sharded as its second is and its last may hold the padding (39 traces over the rows, not 80).
# A rank alone in its group is compared with nothing: it is not traced.
GROUP_WRAPS = {"fsdp2": WrapConfig(flavour="fsdp2"),
               "fsdp2 hybrid bf16": WrapConfig(flavour="fsdp2", sharding="HYBRID", shard_size=4, mixed_precision="bf16"),
               "fsdp1 layer orig bf16 ac": WRAPS["fsdp1 layer orig bf16 ac"],
               "fsdp1 sgo orig": WRAPS["fsdp1 sgo orig"],
               "fsdp1 lora orig": WrapConfig(flavour="fsdp1", policy="lora", use_orig_params=True)}
GROUP_ROWS = covering_array(dict(wrap=list(GROUP_WRAPS), model=["llama", "qwen3_moe", "qwen2"], world=[3, 8],
                                 backend=["gloo", "nccl"]),
                            allowed=lambda r: "hybrid" not in r["wrap"] or r["world"] == 8)

@functools.cache
def two_layers(name:str):
    "A shipped tiny model as it is (2 decoder layers: traced whole); LoRA on q_proj and v_proj."
    cfg = dict(shipped_config(name), **(MOE if "moe" in name else {}))
    return add_lora(model_from_config(cfg, device="meta"), r=8, target_modules=("q_proj", "v_proj"))

GROUPED = []   # (row, ranks, groups): what the rows grouped, for the test that grouping is not vacuous

def sampled(sig:tuple)->list[int]:
    "The ranks traced: the first, second and last of each group of several ranks (signature `sig[r]` per rank)."
    groups = {}
    for r, s in enumerate(sig): groups.setdefault(s, []).append(r)
    return sorted({r for g in groups.values() if len(g) > 1 for r in (g[0], g[1], g[-1])})

def test_sampled():
    assert sampled("aab") == [0, 1] and sampled("abc") == []
    assert sampled("abcdeeee") == [4, 5, 7] and sampled("aaaabbbb") == [0, 1, 3, 4, 5, 7]

@pytest.mark.parametrize("row", GROUP_ROWS, ids=lambda r: "-".join(map(str, r.values())))
def test_ranks_of_one_signature_trace_alike(row):
    pm, cfg, world = two_layers(row["model"]), GROUP_WRAPS[row["wrap"]], row["world"]
    sig = rank_signatures(pm, cfg, world)   # read with no step run (as `predict_step_memory` groups the ranks with
    # copies to spare; else it reads them from its first rank's trace: equal, as the next line checks)
    ranks = sampled(sig)
    traces = dict(zip(ranks, trace_many(pm, cfg, world, ranks, 1, 16, row["backend"])))
    assert all(t.signatures == sig for t in traces.values())   # every rank traced sees the same grouping
    answer = lambda t: (t.peak, t.worst_peak, t.by_category, t.sharded_bytes, t.optimizer_bytes)
    for r, t in traces.items():
        first = sig.index(sig[r])   # the rank `predict_step_memory` traces for r's group
        assert answer(t) == answer(traces[first]), (r, first, answer(t), answer(traces[first]))
    GROUPED.append((row, world, len(set(sig)), len(ranks)))

def test_grouping_saves_traces():
    """Not vacuous: some FSDP1 use_orig_params rows at world 8 trace fewer ranks than the world (measured: 1-4 of 8),
    and rows compare ranks (39 traces in all, 2026-12-03)."""
    assert [g for row, w, g, n in GROUPED if w == 8 and "orig" in row["wrap"] and g < w], GROUPED
    assert all(n >= 2 for *_, n in GROUPED), GROUPED

"""bench/device_check.py works before an accelerator is lent: run as a user runs it, on the CPU (2 gloo ranks), it
measures every gather strategy on FSDP1 and FSDP2 and writes a JSON whose per-unit bytes equal the plan's
prediction and whose totals are consistent with its units, and a PNG with one row per flavour; its checks flag a
measured byte count that strays from the plan. Its training-step memory part says on the CPU that there is no device
and skips; its check flags a prediction more than 5 % off `max_memory_allocated`; its cases include fp32 master weights
with bf16 compute (a bf16 config, predicted with param_dtype="fp32"), and it reports `max_memory_reserved` beside."""
import json, os, subprocess, sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import device_check as DC

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("device_check")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "device_check.py"), "--out", str(out),
                        "--layers", "3"], capture_output=True, text=True, timeout=400, cwd=ROOT)
    return r, out

def test_exits_ok_and_says_so(run):
    r, _ = run
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "platform: cpu" in r.stdout and "device check: OK" in r.stdout

def test_json_has_every_strategy_on_every_rank(run):
    _, out = run
    res = json.loads((out/"device_check.json").read_text())
    assert res["platform"]["name"] == "cpu" and res["platform"]["backend"] == "gloo"
    assert res["world_sizes"] == [2] and res["failed"] == [] and res["problems"] == []
    assert res["versions"]["torch"] and res["versions"]["transformers"] and res["versions"]["peft"]
    assert sorted(r["rank"] for r in res["runs"]) == [0, 1]
    for run_ in res["runs"]:
        assert run_["errors"] == []
        got = sorted((row["setting"], row["strategy"]) for row in run_["rows"])
        assert got == sorted((s, k) for s, ks in DC.STRATEGIES.items() for k in ks)

def test_units_add_up_and_match_the_plan(run):
    _, out = run
    res = json.loads((out/"device_check.json").read_text())
    for row in (row for r in res["runs"] for row in r["rows"]):
        units = row["units"]
        assert units and row["memory_source"].startswith("torch MemTracker")
        assert sum(u["bytes_gathered"] for u in units) == row["bytes_gathered"]
        assert row["bytes_gathered"] == row["predicted_bytes"], row["strategy"]
        for u in units:
            assert u["predicted_bytes"] is not None and u["bytes_gathered"] == u["predicted_bytes"], u
        assert 0 < row["peak_extra"] and max(u["peak_extra"] for u in units) <= row["peak_extra"]
        if row["strategy"] != "whole": assert row["bytes_gathered"] < row["model_bytes"]

def test_png_has_a_row_per_flavour(run):
    _, out = run
    import matplotlib.image as mpimg
    img = mpimg.imread(out/"device_check.png")
    h, w = img.shape[:2]
    assert w >= 1000 and h >= 2 * 300          # two rows (FSDP1, FSDP2) of per-unit and per-strategy panels
    assert img[..., :3].std() > 0.05             # something is drawn

def test_problems_flag_a_stray_byte_count():
    row = dict(world_size=2, setting="fsdp1", strategy="per_unit", rank=0, predicted_bytes=1000, bytes_gathered=1100)
    p, = DC.problems([dict(rows=[row], errors=[])])
    assert "+10.0%" in p and "fsdp1/per_unit" in p
    assert DC.problems([dict(rows=[dict(row, bytes_gathered=1040)], errors=[])]) == []   # within 5 %
    err = dict(world_size=1, setting="fsdp1", rank=0, error="AttributeError: x")
    assert DC.problems([dict(rows=[], errors=[err])]) == ["world 1 fsdp1 rank 0 failed: AttributeError: x"]

def test_world_sizes():
    assert DC.world_sizes("cpu", 1) == [2]
    assert DC.world_sizes("cuda", 8) == [8, 1] and DC.world_sizes("npu", 1) == [1]
    with pytest.raises(RuntimeError, match="nothing to run on"): DC.world_sizes("cuda", 0)

def test_memory_part_skips_on_the_cpu_and_says_so(run):
    r, out = run
    assert "memory check: no GPU or NPU here (platform cpu): skipped" in r.stdout
    res = json.loads((out/"device_check.json").read_text())
    assert res["memory_skipped"] is True and res["memory"] == []

def test_memory_problems_flag_a_prediction_off_by_more_than_5_percent():
    name = DC.MEMORY_CASES[0][0]
    assert len(DC.MEMORY_CASES) == 8
    ok = dict(case=name, rank=1, peak=1000)
    assert DC.memory_problems([ok], {name: [0, 1040]}) == []
    p, = DC.memory_problems([ok], {name: [0, 1100]})
    assert "+10.0%" in p and f"memory {name} rank 1" in p
    p, = DC.memory_problems([dict(case=name, rank=0, error="OutOfMemoryError: x")], {name: [1]})
    assert p.endswith("failed: OutOfMemoryError: x")
    p, = DC.memory_problems([dict(ok, rank=0)], {name: "the experts implementation ... cannot"})
    assert "no prediction" in p

def test_memory_predictions_record_the_attention_kernel(monkeypatch):
    "On NCCL the two float32 Llama cases are predicted with the math kernel CUDA runs them on, the rest fused."
    import types
    import lora_fsdp_kit.fits.core as F
    seen, told = {}, {}
    def fake_predict(pm, *, attention, param_dtype, **kw):
        seen[len(seen)], told[len(told)] = attention, param_dtype
        return types.SimpleNamespace(peak_bytes=[1], label="stub")
    monkeypatch.setattr(F, "predict_step_memory", fake_predict)
    monkeypatch.setattr(DC, "get_platform", lambda: types.SimpleNamespace(dist_backend="nccl"))
    # the cases this transformers can build (4.57, the oldest supported, has no Qwen3-Omni thinker)
    from transformers import CONFIG_MAPPING
    from lora_fsdp_kit.config_files import shipped_config
    monkeypatch.setattr(DC, "MEMORY_CASES", [c for c in DC.MEMORY_CASES
                                             if shipped_config(c[1])["model_type"] in CONFIG_MAPPING])
    pred, kernels = DC.predict_memory(1, 1, 8)
    assert list(kernels) == [n for n, *_ in DC.MEMORY_CASES] and list(seen.values()) == list(kernels.values())
    assert {n for n, k in kernels.items() if k == "math"} == {"llama fsdp2 fp32", "llama fsdp1 lora fp32"}
    assert set(kernels.values()) == {"math", "fused"} and all(v == [1] for v in pred.values())
    # fp32 master weights with bf16 compute: a bf16 config, predicted with param_dtype="fp32" (the ranks build fp32)
    master = {n for n, _, over, wrap, pdt in DC.MEMORY_CASES if pdt == "fp32"}
    assert {n for n, *_ in DC.MEMORY_CASES if "fp32 master" in n} == master and len(master) == 2
    assert all(over.get("dtype") == "bfloat16" and wrap["mixed_precision"] == "bf16"
               for n, _, over, wrap, _ in DC.MEMORY_CASES if n in master)
    assert {w["flavour"] for n, _, _, w, _ in DC.MEMORY_CASES if n in master} == {"fsdp1", "fsdp2"}
    assert [told[i] for i, n in enumerate(kernels)] == [p for n, *_, p in DC.MEMORY_CASES]
    assert DC.STORAGE["fp32"] is torch.float32

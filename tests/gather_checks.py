"""Assertions shared by the gather tests on the rows that `gather_cases.run_matrix` returns."""
from __future__ import annotations

CHECKS = ("before_equal", "keys_equal", "values_equal", "own_storage", "merged_names_equal", "merged_equal",
          "merged_full", "rank0_only_ok")

def label(r:dict)->str:
    keys = ("model", "setting", "policy", "sharding", "adapter", "tied", "head_lora", "modules_to_save", "second_adapter")
    return "/".join(str(r[k]) for k in keys if r.get(k) not in (None, False))

def rows_of(results:list[dict])->list[dict]: return [dict(r, rank=res["rank"]) for res in results for r in res["rows"]]

def ran(rows:list[dict])->list[dict]: return [r for r in rows if "refused" not in r]

def assert_no_errors(rows:list[dict]):
    errors = [f"{label(r)} (rank {r['rank']}):\n{r['error']}" for r in rows if "error" in r]
    assert not errors, "\n".join(errors)

def assert_refusals_are_fsdp1_mixed_grad(rows:list[dict]):
    # FSDP1 refuses only use_orig_params=False with frozen base and trainable LoRA in one flat parameter
    for r in rows:
        if "refused" in r:
            assert r["setting"] == "fsdp1", r
            assert "uniform `requires_grad`" in r["refused"], r["refused"]

def assert_equal_to_peft(rows:list[dict]):
    for check in CHECKS:
        bad = [label(r) for r in ran(rows) if not r.get(check)]
        assert not bad, f"{check} fails for {bad}"
    # after the optimizer steps the trained adapter really differs from its start (the test can fail)
    bad = [label(r) for r in ran(rows) if r["adapter"] == "default" and not r["changed"]]
    assert not bad, f"LoRA unchanged by training: {bad}"

def assert_one_collective_lora_bytes(rows:list[dict]):
    "One collective per gather; bytes = the plan's prediction = LoRA bytes + padding, never a base weight."
    for r in ran(rows):
        if r["shard_world"] == 1:   # NO_SHARD / one rank: everything is local
            assert (r["collectives"], r["bytes_gathered"]) == (0, 0), label(r)
            continue
        assert r["collectives"] == 1, (label(r), r["collectives"])
        # the plan counts LoRA tensors and modules_to_save copies; with LoRA on a tied head peft's state dict also
        # holds the (shared) embedding weight, which the plan does not name: there the bound below is the check
        if not r.get("head_lora"):
            assert r["bytes_gathered"] == r["predicted_bytes"], (label(r), r["bytes_gathered"], r["predicted_bytes"])
        # padding: FSDP2 pads dim 0 to the shard group; FSDP1 pads to the rank holding most (at most 5 %)
        assert r["lora_bytes"] <= r["bytes_gathered"] <= max(1.05 * r["lora_bytes"], r["padded_bytes"]), label(r)
        # rank0_only: rank 0 receives what everybody did; the others nothing
        if r["rank"] == 0: assert r["rank0_only_bytes"] == r["bytes_gathered"] or \
                                  r["rank0_only_bytes"] == r["lora_bytes"], label(r)
        else: assert r["rank0_only_bytes"] == 0, label(r)

"""Bench: every figure of the README's "Why" table, measured on the prior art and on the kit side by side, in one run.

The prior art: verl's per-unit LoRA collector (`layered_summon_lora_params` / `collect_lora_params` and its LoRA wrap
policy, verl/utils/fsdp_utils.py), peft's `fsdp_auto_wrap_policy`, `get_peft_model_state_dict` and `save_pretrained`,
accelerate's FSDP2 preparation (`fsdp2_prepare_model`), torchtune's FSDP2 adapter gather (`gather_cpu_state_dict`).
peft and accelerate run as installed; verl and torchtune are not dependencies, so the lines each row is about are
re-implemented in bench/prior_art_cases.py (each names the file and function it follows).

verl pins peft 0.19.1, and its per-unit path depends on it: peft >= 0.21 selects adapter keys by full module names,
so the collector's unit-relative names never match and the per-unit path returns nothing. The verl rows therefore
run twice: with the installed peft, and with peft 0.19.1 from --verl-peft DIR (default bench/out/peft-0.19.1; made by
`.venv/bin/pip install --no-deps --target bench/out/peft-0.19.1 peft==0.19.1`); without it those figures are marked
as needing it. Models: a 24-layer llama of hidden size 256 (LoRA r=8 on q/k/v/o; `--quick`: 2 layers of 64) and
tiny llamas for the small rows; the Omni sizes from the kit's full-size configs on the meta device. CPU, gloo,
2 ranks through the kit's launcher. Bytes are all-gather outputs counted on rank 0 (torch dispatch), fp32 values.
Run: `python bench/prior_art.py [--quick] [--verl-peft DIR]`; writes bench/out/prior_art.json.
"""
from __future__ import annotations

import argparse, json, os, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))   # spawned ranks inherit sys.path
import prior_art_cases as C
from lora_fsdp_kit.launch import launch
from lora_fsdp_kit.models import model_from_config
from lora_fsdp_kit.config_files import shipped_config
from lora_fsdp_kit.units import fmt_bytes
from lora_fsdp_kit.strip import strip_submodules

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "out")
VERL_PEFT = "0.19.1"
GET_PEFT = f".venv/bin/pip install --no-deps --target bench/out/peft-{VERL_PEFT} peft=={VERL_PEFT}"

def _x(a:int, b:int)->str: return f"{a / b:.0f}×" if a >= 10 * b else f"{a / b:.2f}×"

def _kit(k:dict, wanted:int, lora:int|None=None)->str:
    s = f"{k['tensors']}/{wanted} tensors, bitwise equal to peft's: {k['equal']}; {fmt_bytes(k['bytes'])} in " \
        f"{k['calls']} collective(s)"
    return s + (f" ({_x(k['bytes'], lora)} the LoRA bytes)" if lora else "")

def _verl(r:dict, peft:str)->str:
    "What verl's collector did, in words."
    p, w = r["prior"], r["wanted"]
    path = (f"per-unit path {p['layered']} tensors" + (", falls back to a whole-model summon" if p["fallback"] else ""))
    out = f"[peft {peft}] {path}: {fmt_bytes(p['bytes'])} all-gathered ({p['calls']} calls), "
    out += f"returns {p['tensors']}/{w} tensors" + (", equal to peft's" if p["equal"] else "")
    return out + (f"; raises {p['error']}" if p["error"] else "")

def _pick(res:dict, old:dict|None, key:str)->tuple[dict, str]:
    "The verl row under verl's pinned peft when it ran, else under the installed one."
    return (old[key], old["peft"]) if old and "error" not in old[key] else (res[key], res["peft"])

def _err(r:dict)->str|None: return r.get("error") if "prior" not in r else None

def verl_rows(res:dict, old:dict|None, llama:str)->list[dict]:
    rows, note = [], "" if old else f" (verl's peft {VERL_PEFT} not found: {GET_PEFT})"
    r, pv = _pick(res, old, "leaf")
    if not _err(r):
        p = r["prior"]
        rows.append(dict(id="leaf-units", setting=f"verl's LoRA policy (LoRA leaves + decoder layers), FSDP1, {llama}, "
                         "LoRA r=8 q/k/v/o" + note,
                         prior=[_verl(r, pv)] + ([_verl(res["leaf"], res["peft"])] if old else []),
                         kit=_kit(r["kit"], r["wanted"], r["lora_bytes"]),
                         figures=[("0 tensors", f"{p['layered']} tensors"), ("56.36 MiB", fmt_bytes(p["bytes"])),
                                  ("1.31 MiB", fmt_bytes(r["lora_bytes"])), ("43×", _x(p["bytes"], r["lora_bytes"]))]))
    r, pv = _pick(res, old, "nested")
    if not _err(r):
        p, v = r["prior"], lambda b: f"{b // 4:,}"
        rows.append(dict(id="nested-units", setting="decoder-layer units with an MLP unit nested inside, FSDP1 "
                         "use_orig_params=True, tiny llama, LoRA r=4 q/v" + note,
                         prior=[_verl(r, pv), f"{v(p['bytes'])} values gathered; a per-unit summon without "
                                f"recursion needs {v(r['own_bytes'])}"] +
                               ([_verl(res["nested"], res["peft"])] if old else []),
                         kit=_kit(r["kit"], r["wanted"]) + f" = {v(r['kit']['bytes'])} values",
                         figures=[("89,088", v(p["bytes"])), ("53,248", v(r["own_bytes"]))]))
    r, pv = _pick(res, old, "layer")
    if not _err(r):
        p = r["prior"]
        rows.append(dict(id="layer-units", setting=f"decoder layers as units, FSDP1 use_orig_params=True, {llama}"
                         + note,
                         prior=[_verl(r, pv)] + ([_verl(res["layer"], res["peft"])] if old else []),
                         kit=_kit(r["kit"], r["wanted"], r["lora_bytes"]),
                         figures=[("55.36 MiB", fmt_bytes(p["bytes"])), ("1.31 MiB", fmt_bytes(r["lora_bytes"]))]))
    r, pv = _pick(res, old, "size")
    if not _err(r):
        p, flat = r["prior"], (r["flat_error"] or "no error").replace("`", "")
        rows.append(dict(id="size-units", setting="verl's policy with min_num_params=5000 (its guard drops the LoRA "
                         "leaves), FSDP1, tiny llama, LoRA r=8 q/k/v/o" + note,
                         prior=[f"use_orig_params=False: FSDP raises {flat}", "use_orig_params=True: " + _verl(r, pv)] +
                               ([_verl(res["size"], res["peft"])] if old else []),
                         kit=f"plan: {len(r['plan_errors'])} ✖ errors before wrapping; gather: " +
                             _kit(r["kit"], r["wanted"]),
                         figures=[("uniform requires_grad", "uniform requires_grad" if "uniform" in flat else flat),
                                  ("4 of 12", f"{p['tensors']} of {r['wanted']}")]))
    return rows + [dict(id=f"verl:{k}", error=res[k].get("error") or old[k].get("error"))
                   for k in ("leaf", "nested", "layer", "size") if _err(res[k]) or (old and _err(old[k]))]

def other_rows(res:dict, llama:str)->list[dict]:
    rows = []
    r = res["peft_policy"]
    if not _err(r):
        p, k = r["prior"], r["kit"]
        rows.append(dict(id="peft-policy", setting=f"peft {res['peft']} fsdp_auto_wrap_policy, FSDP1, tiny llama; "
                         "torch's FULL_STATE_DICT given to peft", prior=[
                         f"get_peft_model_state_dict(model.module, state_dict=full): {p['keys']} keys",
                         f"save_pretrained(d, state_dict=full): a {p['file_bytes']}-byte adapter_model.safetensors "
                         f"holding {p['file_tensors']} tensors, no warning"],
                         kit=_kit(k, r["wanted"]) + f"; save_lora: {k['file_bytes']:,} bytes, {k['file_tensors']} "
                             f"tensors, equal to peft's of the unwrapped model: {k['file_equal']}",
                         figures=[("0 keys", f"{p['keys']} keys"), ("40-byte", f"{p['file_bytes']}-byte")]))
    r = res["accelerate_fsdp2"]
    if not _err(r):
        role = lambda n: ("root" if n == "<root>" else "embedding" if n.endswith("embed_tokens") else
                          "tail" if n.endswith(("lm_head", "norm")) else n)
        got = ", ".join(dict.fromkeys(role(n) for n in r["prior"]["names"]))
        rows.append(dict(id="accelerate-fsdp2", setting=f"accelerate {res['accelerate']} fsdp2_prepare_model with "
                         "peft's fsdp_auto_wrap_policy, tiny llama", prior=[
                         f"peft's policy asks for {r['asked']} units; accelerate shards {r['prior']['units']}: {got}"],
                         kit=f"FSDP2 on the {r['asked']} modules the policy names, then the root: "
                             f"{r['kit']['units']} units; gather " + _kit(r["kit"], r["wanted"]),
                         figures=[("embedding, tail, root", ", ".join(sorted(got.split(", "))).replace(
                             "embedding, root, tail", "embedding, tail, root"))]))
    r = res["torchtune_fsdp2"]
    if not _err(r):
        p = r["prior"]
        every = "every parameter" if p["bytes"] >= r["model_bytes"] else f"{fmt_bytes(p['bytes'])} of the model"
        rows.append(dict(id="torchtune-fsdp2", setting=f"FSDP2 on each decoder layer, then the root, {llama}, "
                         "LoRA r=8 q/k/v/o", prior=[
                         f"full_tensor() on each of {p['calls']} state-dict entries: {fmt_bytes(p['bytes'])} "
                         f"all-gathered (model {fmt_bytes(r['model_bytes'])}) for {fmt_bytes(r['lora_bytes'])} of "
                         f"LoRA ({_x(p['bytes'], r['lora_bytes'])}); {p['tensors']} kept after the filter"],
                         kit=_kit(r["kit"], r["wanted"], r["lora_bytes"]), figures=[("every parameter", every)]))
    return rows + [dict(id=k, error=res[k]["error"]) for k in ("peft_policy", "accelerate_fsdp2", "torchtune_fsdp2")
                   if _err(res[k])]

OMNI = {  # shipped full-size config: (stages in order, README figures in billions as quoted)
    "qwen3_omni_default": (("thinker", "talker", "code2wav"), ("18.6", "3.35", "0.22")),
    "qwen2_5_omni_default": (("thinker", "talker", "token2wav"), ("11.3", "6.6", "0.45")),
}

def omni_rows()->list[dict]:
    "Default-size Omni models on the meta device: each stage's parameters, and what strip_submodules frees."
    rows = []
    for name, (stages, quoted) in OMNI.items():
        m = model_from_config(shipped_config(name))          # meta: shapes only
        sizes = [sum(p.numel() for p in getattr(m, s).parameters()) for s in stages]
        rep = strip_submodules(m)
        left = sum(p.numel() for p in m.parameters())
        as_quoted = [f"{n / 1e9:.{len(q.split('.')[1])}f}" for n, q in zip(sizes, quoted)]
        rows.append(dict(id=f"omni:{name.removesuffix('_default')}", setting=f"{name} config, on the meta device",
                         prior=["loads every stage: " + ", ".join(f"{s} {n / 1e9:.3f} B"
                                                                  for s, n in zip(stages, sizes))],
                         kit=f"strip_submodules deletes {', '.join(r.name for r in rep.removed)} ("
                             f"{sum(r.params for r in rep.removed) / 1e9:.3f} B parameters), leaves {left / 1e9:.3f} B",
                         figures=[(f"{q} B", f"{a} B") for q, a in zip(quoted, as_quoted)]))
    return rows

def show(rows:list[dict])->int:
    "Print the table; return how many README figures differ from the run."
    differ = 0
    for i, r in enumerate(rows, 1):
        if "error" in r:
            print(f"\n[{i}] {r['id']}: FAILED TO RUN\n    {r['error']}"); differ += 1; continue
        bad = [(q, m) for q, m in r["figures"] if q != m]
        differ += len(bad)
        print(f"\n[{i}] {r['id']} — {r['setting']}")
        for j, p in enumerate(r["prior"]): print(f"    {'prior art' if j == 0 else '':<10}{p}")
        print(f"    {'kit':<10}{r['kit']}")
        figs = "; ".join(f"{q}" + ("" if q == m else f" (this run: {m})") for q, m in r["figures"])
        print(f"    {'README':<10}{figs}  [{'reproduced' if not bad else 'DIFFERS'}]")
    return differ

def main(argv=None)->int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="2-layer llama of hidden 64 instead of 24 layers of 256")
    ap.add_argument("--verl-peft", default=os.path.join(OUT, f"peft-{VERL_PEFT}"),
                    help=f"a folder holding peft {VERL_PEFT} (verl's pin), for the verl rows")
    a = ap.parse_args(argv)
    big = dict(layers=2, hidden=64) if a.quick else C.BIG
    t0, load = time.perf_counter(), os.getloadavg()[0]
    os.makedirs(OUT, exist_ok=True)
    res = launch(C.all_rows, tempfile.mkdtemp(prefix="lfk_prior_"), big, nprocs=2, quiet=True, timeout=900)[0]
    old = None
    if os.path.isdir(os.path.join(a.verl_peft, "peft")):
        sys.path.insert(0, a.verl_peft)                   # the ranks import peft from here (spawn copies sys.path)
        try: old = launch(C.verl_rows, big, nprocs=2, quiet=True, timeout=900)[0]
        finally: sys.path.remove(a.verl_peft)
        if old["peft"] != VERL_PEFT: sys.exit(f"{a.verl_peft} holds peft {old['peft']}, not {VERL_PEFT}")
    llama = f"{big['layers']}-layer llama h{big['hidden']}"
    rows = verl_rows(res, old, llama) + other_rows(res, llama) + omni_rows()
    print(f"# The README's 'Why' table, measured: prior art and kit side by side (CPU, gloo, 2 ranks; "
          f"{big['layers']}-layer llama h{big['hidden']} for the large rows)")
    differ = show(rows)
    took = time.perf_counter() - t0
    print(f"\n{len(rows)} rows, {sum(len(r.get('figures', [])) for r in rows)} README figures, {differ} differ; "
          f"{took:.0f} s (load average {load:.1f} at the start, on {os.cpu_count()} CPUs)")
    with open(os.path.join(OUT, "prior_art.json"), "w") as f:
        json.dump(dict(rows=rows, seconds=took, quick=a.quick), f, indent=1, default=str)
    return 0

if __name__ == "__main__":
    sys.exit(main())

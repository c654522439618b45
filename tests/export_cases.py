"""Rank-side cases for tests/test_export.py: train under FSDP, save, compare with peft and torch, load, stream."""
from __future__ import annotations

import contextlib, errno, json, os, shutil, time, traceback
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from peft import LoraConfig, PeftModel, get_peft_model_state_dict
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import beyond_cases
from beyond_cases import SETTINGS as BEYOND_SETTINGS
import lora_fsdp_kit.export.core as E
from lora_fsdp_kit.gather.core import gather_lora
from lora_fsdp_kit.gather.merged import iter_merged_weights
from lora_fsdp_kit.memory.core import AllGatherCounter
from lora_fsdp_kit.export.measure_streams import measure_save, measure_stream
from lora_fsdp_kit.testing.core import case_config, case_model, train_steps
from lora_fsdp_kit.models import tiny_lora_model, tiny_model
from lora_fsdp_kit.plan.wrap import WrapConfig

# (name, FSDP flavour, policy, use_orig_params, second adapter?)
SETTINGS = {
    "fsdp1-peft": ("fsdp1", "peft", False, False),        # peft's own policy: LoRA leaves are units (flat params)
    "fsdp1-guarded": ("fsdp1", "guarded", True, False),   # lambda | layers | size, guarded: LoRA inside size units
    "fsdp1-layers": ("fsdp1", "layer", True, True),       # decoder layers, use_orig_params=True, two adapters
    "fsdp2": ("fsdp2", "peft", None, True),               # FSDP2 on peft's units, two adapters
}
SECOND = "second"

def build(setting:str, perturb:bool=True):
    "The tiny llama with LoRA (and a second, named adapter); `perturb`: the second adapter gets other values."
    pm = tiny_lora_model("llama")
    if SETTINGS[setting][3]:
        pm.add_adapter(SECOND, LoraConfig(r=2, lora_alpha=8, target_modules=["k_proj", "o_proj"]))
        g = torch.Generator().manual_seed(7 if perturb else 8)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if f".{SECOND}." in n: p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return pm

def wrap(pm, setting:str):
    flavour, kind, orig, _ = SETTINGS[setting]
    return case_config(kind, "fsdp1-orig" if orig else flavour).wrap(pm)

def _tree(f:Path)->dict: return {str(p.relative_to(f)): p.read_bytes() for p in sorted(f.rglob("*")) if p.is_file()}

def _equal(a:dict, b:dict)->bool: return list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
def _logits(m): 
    with torch.no_grad(): return m(input_ids=torch.arange(12).reshape(2, 6)).logits

def torch_full_state(fm, setting:str)->dict:
    "Every parameter, full, on rank 0, gathered by torch itself (FSDP2: get_model_state_dict; FSDP1: summon)."
    if SETTINGS[setting][0] == "fsdp2":
        return get_model_state_dict(fm, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # (torch's get_model_state_dict fails on these FSDP1 models, before any gather: "setStorage ... out of bounds")
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp._common_utils import clean_tensor_name
    with FSDP.summon_full_params(fm, writeback=False, rank0_only=True):
        if dist.get_rank() != 0: return {}
        return {clean_tensor_name(n): p.detach().clone() for n, p in fm.named_parameters()}

def _config(d:Path)->dict:
    "adapter_config.json, with the fields peft keeps as sets (written in set order) sorted."
    c = json.loads((d/E.ADAPTER_CONFIG).read_text())
    sets = ("target_modules", "exclude_modules")
    return {k: sorted(v) if k in sets and isinstance(v, list) else v for k, v in c.items()}

def check_saved(d:Path, ref, name:str, folder:Path)->dict:
    "Rank 0: the saved adapter against peft's own save of the unwrapped reference, and loaded with plain peft."
    out = {}
    ref.save_pretrained(str(folder), selected_adapters=[name])
    pdir = folder if name == "default" else folder/name
    out["file_equal"] = (d/E.ADAPTER_WEIGHTS).read_bytes() == (pdir/E.ADAPTER_WEIGHTS).read_bytes()
    mine, peft_s = _config(d), _config(pdir)
    out["config_equal"] = mine == peft_s
    out["config_diff"] = {k: (mine.get(k), peft_s.get(k)) for k in set(mine) | set(peft_s)
                          if mine.get(k) != peft_s.get(k)}
    loaded = PeftModel.from_pretrained(tiny_model("llama"), str(d), adapter_name=name)
    out["state_equal"] = _equal(get_peft_model_state_dict(loaded, adapter_name=name),
                                get_peft_model_state_dict(ref, adapter_name=name))
    ref.set_adapter(name)
    out["logits_equal"] = torch.equal(_logits(loaded), _logits(ref))
    ref.set_adapter("default")
    return out

OLD_FIELDS = ("lora_bias", "exclude_modules", "trainable_token_indices", "target_parameters", "use_qalora",
              "qalora_group_size", "alora_invocation_tokens", "arrow_config", "ensure_weight_tying", "corda_config",
              "eva_config")   # fields peft < 0.14 did not write

def load_variants(fm, setting:str, d:Path, trained:dict)->dict:
    """What peft loads, load_lora loads: an old peft's config, a regex naming the same modules (not: other modules),
    and peft's pickle (adapter_model.bin)."""
    src = d/"adapter"
    cfg = json.loads((src/E.ADAPTER_CONFIG).read_text())
    same = r".*\.(" + "|".join(sorted(cfg["target_modules"])) + ")"
    variants = {"peft < 0.14": {k: v for k, v in cfg.items() if k not in OLD_FIELDS},
                "regex": dict(cfg, target_modules=same),
                "regex, other modules": dict(cfg, target_modules=r".*\.q_proj")}
    pickle = "adapter_model.bin"   # peft's own save_pretrained(safe_serialization=False): a pickle, no safetensors
    if dist.get_rank() == 0:
        for name, c in variants.items():
            shutil.copytree(src, d/name); (d/name/E.ADAPTER_CONFIG).write_text(json.dumps(c))
        PeftModel.from_pretrained(tiny_model("llama"), src).save_pretrained(str(d/pickle), safe_serialization=False)
    dist.barrier()
    out = {"pickle files": sorted(p.name for p in (d/pickle).iterdir())}
    for name in [*variants, pickle]:
        fresh = wrap(build(setting, perturb=False), setting)
        try: E.load_lora(fresh, d/name); out[name] = _equal(gather_lora(fresh, progress=False), trained)
        except Exception as e: out[name] = f"{type(e).__name__}: {e}"
        if dist.get_rank() == 0 and name != "regex, other modules":   # and peft itself loads it, to the same tensors
            ref = PeftModel.from_pretrained(tiny_model("llama"), d/name)
            out[name + " (peft)"] = _equal(get_peft_model_state_dict(ref), trained)
    return out

def one(folder:str, setting:str)->dict:
    rank, res, t0 = dist.get_rank(), dict(setting=setting, world=dist.get_world_size()), time.perf_counter()
    two = SETTINGS[setting][3]
    d = Path(folder)/setting
    fm = wrap(build(setting), setting)
    res["losses"] = train_steps(fm, 3)
    # a model's first save builds its pack plan, kept for the model's life (an index of 8 B per row of LoRA bytes:
    # well under 1 % of them on real shapes, about as much as the LoRA on this model's tiny ones): the measured save
    # is a planned one, as every save after the first is
    E.save_lora(fm, d/"first")
    res["save"] = measure_save(fm, d/"adapter")
    if two: E.save_lora(fm, d/"both")   # every adapter, in peft's layout: the second in d/both/second
    # an independent reference: torch's own full state dict of the sharded model, in an unwrapped copy
    full = torch_full_state(fm, setting)
    if rank == 0:
        ref = build(setting, perturb=False)
        missing, unexpected = ref.load_state_dict(full, strict=False)
        res["ref_keys_ok"] = not missing and not unexpected
        res["default"] = check_saved(d/"adapter", ref, "default", d/"peft")
        if two:
            res[SECOND] = check_saved(d/"both"/SECOND, ref, SECOND, d/"peft2")
            ref.save_pretrained(str(d/"peft_all"))   # peft's own save of every adapter: the same tree, byte for byte
            res["layout_equal"] = _tree(d/"both") == _tree(d/"peft_all")
        res["b_nonzero"] = all(v.abs().sum() > 0 for k, v in full.items() if "lora_B.default" in k)
    del full
    trained = gather_lora(fm, progress=False)
    # load into a freshly wrapped model: no collective, then equal bit for bit, then the same next steps
    fresh = wrap(build(setting, perturb=False), setting)
    res["differs_before"] = not _equal(gather_lora(fresh, progress=False), trained)
    with AllGatherCounter() as c:
        res["loaded"] = E.load_lora(fresh, d/"adapter")
        if two: E.load_lora(fresh, d/"both"/SECOND, adapter_name=SECOND)
    res["load_collectives"], res["load_collective_bytes"] = c.calls, c.bytes
    res["load_equal"] = _equal(gather_lora(fresh, progress=False), trained)
    if two: res["second_load_equal"] = _equal(gather_lora(fresh, progress=False, adapter_name=SECOND),
                                              gather_lora(fm, progress=False, adapter_name=SECOND))
    res["next"] = (train_steps(fm, 2, start=3), train_steps(fresh, 2, start=3))
    # rank0_only buckets: rank 0 gets every tensor, the others take part and get none
    b0 = list(E.iter_lora_buckets(fm, bucket_bytes=1536, rank0_only=True))
    now = gather_lora(fm, progress=False)
    res["rank0_only_ok"] = (dict(kv for b in b0 for kv in b).keys() == now.keys() and
                            all(torch.equal(t, now[k]) for b in b0 for k, t in b)) if rank == 0 else b0 == []
    # LoRA buckets: none over the limit, concatenated equal to the stream and to gather_lora
    lb, ls = list(E.iter_lora_buckets(fm, bucket_bytes=1536)), list(E.iter_lora(fm))
    res["lora_buckets"] = [sum(E.tensor_nbytes(t) for _, t in b) for b in lb]
    res["lora_bucket_single_over"] = all(len(b) == 1 for b in lb if sum(E.tensor_nbytes(t) for _, t in b) > 1536)
    res["lora_concat_equal"] = (_equal(dict(kv for b in lb for kv in b), dict(ls))
                                and [k for b in lb for k, _ in b] == [k for k, _ in ls]
                                and _equal(dict(sorted(dict(ls).items())), dict(sorted(now.items()))))
    # LoRA buckets move only the LoRA pieces (one packed gather per bucket), as gather_lora does
    with AllGatherCounter() as c: list(E.iter_lora_buckets(fm, bucket_bytes=1536))
    with AllGatherCounter() as c2: gather_lora(fm, progress=False)
    res["bucket_moved"], res["gather_moved"] = c.bytes, c2.bytes
    res["lora_bytes"] = sum(E.tensor_nbytes(t) for t in now.values())
    res["peft_variants"] = load_variants(fm, setting, d, trained)
    # merged buckets
    mb = list(E.buckets(iter_merged_weights(fm, progress=False), 65_536))
    ms = list(iter_merged_weights(fm, progress=False))
    res["merged_buckets"] = [sum(E.tensor_nbytes(t) for _, t in b) for b in mb]
    res["merged_bucket_single_over"] = all(len(b) == 1 for b in mb if sum(E.tensor_nbytes(t) for _, t in b) > 65_536)
    res["merged_concat_equal"] = [k for b in mb for k, _ in b] == [k for k, _ in ms] and \
        all(torch.equal(a, b) for (_, a), (_, b) in zip([kv for b in mb for kv in b], ms))
    del mb, ms
    res["streams"] = [measure_stream(fm, b) for b in (None, 65_536, 262_144)]
    res["lora_stream"] = measure_stream(fm, 1536, what="lora")
    # interrupted saves: rank 1 fails right after the gather while rank 0 writes; rank 0's disk fills up
    before = _tree(d/"adapter")
    real = E._lora_state_dict
    def fail_after_gather(*a, **k):
        real(*a, **k); raise RuntimeError("injected failure on rank 1")
    def disk_full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 64); raise OSError(errno.ENOSPC, "No space left on device")
    res["interrupted"] = []
    for who, target, fake in ((1, "_lora_state_dict", fail_after_gather), (0, "save_file", disk_full)):
        with mock.patch.object(E, target, fake) if rank == who else mock.patch.object(E, "_rank", E._rank):
            try: E.save_lora(fm, d/"adapter"); msg = None
            except E.SaveError as e: msg = str(e)
        res["interrupted"].append(dict(who=who, message=msg, intact=_tree(d/"adapter") == before,
                                       leftovers=sorted(p.name for p in d.iterdir() if p.name.startswith("."))))
        dist.barrier()   # every rank has looked before rank 0 starts the next save (and its temporary folder)
    E.save_lora(fm, d/"adapter")   # and a save that works replaces it
    res["replaced"] = _tree(d/"adapter") != before
    res["seconds"] = time.perf_counter() - t0
    return res

def run(folder:str, settings:tuple)->list[dict]:
    "All `settings`, in one launch."
    out = []
    for s in settings:
        try: out.append(one(folder, s))
        except Exception: out.append(dict(setting=s, error=traceback.format_exc()))
    return out

# ---- faults: every rank raises, fast, naming the failing rank and the cause; nothing on disk changes ----
GATHER_FAULT = "in the gather, before its collective"

def _fault_cases(world:int)->list[tuple[str, int]]:
    "(fault, rank) pairs that leave the process group usable, each rank in turn where any rank can fail."
    every = lambda f: [(f, r) for r in range(world)]
    return ([("target is a file", 0), ("target is a dangling symlink", 0)] + every("before the first collective")
            + every("after the gather") + [("during the write", 0), ("Ctrl-C during the write", 0),
                                           ("while publishing", 0)] + every("Ctrl-C after the gather")[1:])

def _inject(fault:str, rank:int, d:Path):
    "The patch that makes `rank` fail at `fault` (a no-op context on the other ranks)."
    import lora_fsdp_kit.gather.core as G
    if dist.get_rank() != rank or fault.startswith("target") or fault in ("another cut on one rank",
                                                                          "a folder of its own"):
        return contextlib.nullcontext()   # those are what the rank passes, not a patch
    real_sd, real_write = E._lora_state_dict, E.write_adapter
    def boom(*a, **k): raise MemoryError(f"injected on rank {rank}: {fault}")
    def after(*a, **k):
        real_sd(*a, **k)
        raise (KeyboardInterrupt() if "Ctrl-C" in fault else RuntimeError(f"injected on rank {rank}: {fault}"))
    def disk_full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"\0" * 64); raise OSError(errno.ENOSPC, "No space left on device")
    def interrupted(model, tensors, folder, *a, **k):
        (Path(folder)/"partial").write_bytes(b"\0" * 64); raise KeyboardInterrupt()
    def half_published():   # the second of the three files fails to move in: the first must be put back
        real, moved = os.replace, []
        def replace(src, dst):
            moved.append(dst)
            if len(moved) == 2: raise OSError(errno.EIO, f"injected on rank {rank}: {fault}")
            return real(src, dst)
        return mock.patch.object(E.os, "replace", replace)
    return {"before the first collective": lambda: mock.patch.object(E, "sharded_view", boom),
            GATHER_FAULT: lambda: mock.patch.object(G, "_buffers", boom),
            "after the gather": lambda: mock.patch.object(E, "_lora_state_dict", after),
            "Ctrl-C after the gather": lambda: mock.patch.object(E, "_lora_state_dict", after),
            "during the write": lambda: mock.patch.object(E, "save_file", disk_full),
            "Ctrl-C during the write": lambda: mock.patch.object(E, "write_adapter", interrupted),
            "while publishing": half_published}[fault]()

def _fault(fm, d:Path, fault:str, who:int)->dict:
    "One injected fault: what this rank raised, how fast, and what the folder holds afterwards."
    target = saveto = d/"adapter"
    if fault == "a folder of its own" and dist.get_rank() == who: saveto = d/"elsewhere"   # `target` is watched
    if fault == "target is a file": target = d/"afile"; target.write_text("x") if dist.get_rank() == 0 else None
    if fault == "target is a dangling symlink":
        target = d/"latest"
        if dist.get_rank() == 0 and not target.is_symlink(): target.symlink_to(d/"nowhere")
    dist.barrier()
    state = lambda: (_tree(target) if target.is_dir() else os.readlink(target) if target.is_symlink()
                     else target.read_bytes())
    before = state()
    t0, kind, msg = time.perf_counter(), None, None
    with _inject(fault, who, d):   # a fault inside the gather waits out `timeout`: 2 s is plenty between 2-3 ranks
        try: E.save_lora(fm, saveto if fault == "a folder of its own" else target,
                         timeout=2.0 if fault == GATHER_FAULT else 8.0)
        except BaseException as e: kind, msg = type(e).__name__, str(e)
    seconds = time.perf_counter() - t0
    after = state()
    return dict(fault=fault, who=who, rank=dist.get_rank(), kind=kind, message=msg, seconds=seconds,
                intact=after == before, leftovers=sorted(p.name for p in d.iterdir() if p.name.startswith(".")))

def faults(folder:str, setting:str="fsdp2", gather_fault_rank:int|None=None)->list[dict]:
    "Rank function: every fault of `_fault_cases` in turn, then (it closes the group) one inside the gather."
    d = Path(folder)/f"{setting}-{dist.get_world_size()}-{gather_fault_rank}"
    if dist.get_rank() == 0: d.mkdir(parents=True, exist_ok=True)
    fm = wrap(build(setting), setting)
    dist.barrier()
    E.save_lora(fm, d/"adapter")       # the adapter every fault must leave as it was
    out = [_fault(fm, d, f, r) for f, r in _fault_cases(dist.get_world_size())]
    # ranks that differ: rank 1's model cut by the other flavour, or its own folder (before, both saved in silence)
    other = "fsdp1-layers" if setting.startswith("fsdp2") else "fsdp2"   # the same adapters, the other flavour
    odd = wrap(build(setting), other if dist.get_rank() == 1 else setting)
    out += [_fault(odd, d, "another cut on one rank", 1), _fault(fm, d, "a folder of its own", 1)]
    dist.barrier()
    E.save_lora(fm, d/"adapter")       # the group still works after all of them
    out.append(dict(fault="a save after them", rank=dist.get_rank(), kind=None, message=None, seconds=0.0,
                    intact=True, leftovers=sorted(p.name for p in d.iterdir() if p.name.startswith("."))))
    out += load_faults(fm, d)
    if gather_fault_rank is not None: out.append(_fault(fm, d, GATHER_FAULT, gather_fault_rank))
    return out

# ---- load_lora faults: every rank raises LoadError within seconds, naming the rank; no rank's model changes ----
LOAD_CAUSE = {"file missing on one rank": "has no adapter_model.safetensors", "damaged file on one rank": "Error",
              "shape mismatch on one rank": "the file holds shape", "before reading": "injected",
              "while writing the shards": "injected", "Ctrl-C while writing the shards": "KeyboardInterrupt"}

def _local(fm)->dict:
    "This rank's own values of every parameter (its FSDP shards): what a load changes on this rank."
    from torch.distributed.tensor import DTensor
    return {n: (p.to_local() if isinstance(p, DTensor) else p).detach().clone() for n, p in fm.named_parameters()}

def _bad_adapters(d:Path):
    "Rank 0 writes the broken copies of `d/adapter` a rank is pointed at: none, damaged, a tensor of another shape."
    from safetensors.torch import load_file, save_file
    for name in ("missing", "damaged", "reshaped"): shutil.copytree(d/"adapter", d/name)
    (d/"missing"/E.ADAPTER_WEIGHTS).unlink()
    w = d/"damaged"/E.ADAPTER_WEIGHTS; w.write_bytes(w.read_bytes()[:100])
    sd = load_file(d/"reshaped"/E.ADAPTER_WEIGHTS); k = next(iter(sd)); sd[k] = torch.zeros(sd[k].shape[0] + 1, 1)
    save_file(sd, str(d/"reshaped"/E.ADAPTER_WEIGHTS), metadata={"format": "pt"})

def _load_fault(fm, d:Path, fault:str, who:int)->dict:
    "One injected load fault on rank `who`: what this rank raised, how fast, and whether its shards changed."
    me, path, patch = dist.get_rank(), d/"adapter", contextlib.nullcontext()
    if me == who:
        path = {"file missing on one rank": d/"missing", "damaged file on one rank": d/"damaged",
                "shape mismatch on one rank": d/"reshaped"}.get(fault, path)
        real = E._write_pieces
        def half(pieces, done):   # write half of this rank's pieces, then fail
            real(pieces[:max(1, len(pieces) // 2)], done)
            raise (KeyboardInterrupt() if "Ctrl-C" in fault else RuntimeError(f"injected on rank {who}: {fault}"))
        def boom(*a, **k): raise RuntimeError(f"injected on rank {who}: {fault}")
        if fault == "before reading": patch = mock.patch.object(E, "lora_keys", boom)
        if "writing the shards" in fault: patch = mock.patch.object(E, "_write_pieces", half)
    before = _local(fm)
    dist.barrier()
    t0, kind, msg = time.perf_counter(), None, None
    with patch:
        try: E.load_lora(fm, path)
        except BaseException as e: kind, msg = type(e).__name__, str(e)
    seconds = time.perf_counter() - t0
    after = _local(fm)
    return dict(fault=fault, who=who, rank=me, kind=kind, message=msg, seconds=seconds,
                unchanged=all(torch.equal(before[k], after[k]) for k in before))

def load_faults(fm, d:Path)->list[dict]:
    "Every load fault on every rank in turn, then a load that works (it changes the model)."
    if dist.get_rank() == 0: _bad_adapters(d)
    with torch.no_grad():   # the model now differs from the saved adapter: a partial load would show
        for n, p in fm.named_parameters():
            if p.requires_grad: p.add_(1.0)
    out = [_load_fault(fm, d, f, r) for f in LOAD_CAUSE for r in range(dist.get_world_size())]
    before = _local(fm)
    dist.barrier()
    E.load_lora(fm, d/"adapter")
    out.append(dict(fault="a load after them", rank=dist.get_rank(), kind=None,
                    changed=any(not torch.equal(before[k], v) for k, v in _local(fm).items())))
    return out


# ---- modules_to_save as its own FSDP unit (issue 47): every export equals peft's, bit for bit ----
# the head in peft's modules_to_save made a unit: the kit's own wrap_lm_head (as accelerate's FSDP2 does with
# get_output_embeddings()), a targets glob naming it, and FSDP1 with the head as a unit of its own
MTS_LAYOUTS = {
    "fsdp2-head": dict(flavour="fsdp2", policy="layer", wrap_lm_head=True),
    "fsdp2-targets": dict(flavour="fsdp2", targets=("LlamaDecoderLayer", "**.lm_head")),
    "fsdp1-head": dict(flavour="fsdp1", policy="layer", use_orig_params=True, wrap_lm_head=True),
}

MTS_AT = {2: tuple(MTS_LAYOUTS), 3: ("fsdp2-head",)}   # at 3 ranks: the head's dim-0 shards are uneven

def _mts_model(): return case_model("llama", modules_to_save=("lm_head",))

def _mts_reference(fm, flavour:str):
    "Rank 0: an unwrapped copy holding torch's own full state dict of the trained model (None elsewhere)."
    full = torch_full_state(fm, "fsdp2" if flavour == "fsdp2" else "fsdp1-layers")
    if dist.get_rank() != 0: return None, False
    ref = _mts_model()
    missing, unexpected = ref.load_state_dict(full, strict=False)
    return ref, not missing and not unexpected

def _mts_checks(ref, got:dict, lb:list, ls:list, merged:dict, d:Path)->dict:
    "Rank 0: the gather, both streams, the saved tree and the merged weights against peft's on the reference."
    want, res = {k: v.detach() for k, v in get_peft_model_state_dict(ref).items()}, {}
    res["head_in_state"] = any(".modules_to_save." not in k and "lm_head" in k for k in want)
    res["gather_equal"] = _equal(got, want)
    flat = dict(kv for b in lb for kv in b)
    res["buckets_equal"] = len(lb) > 1 and _equal(dict(sorted(flat.items())), dict(sorted(want.items())))
    res["stream_equal"] = _equal(dict(ls), want)
    ref.save_pretrained(str(d/"peft"))
    res["tree_equal"] = _tree(d/"adapter") == _tree(d/"peft")   # weights, config and model card, byte for byte
    res["files"] = sorted(_tree(d/"adapter"))
    mref = {n: p.detach() for n, p in ref.merge_and_unload().named_parameters(remove_duplicate=False)}
    res["merged_equal"] = set(merged) == set(mref) and all(torch.equal(merged[k], mref[k]) for k in mref)
    return res

def modules_to_save_unit(folder:str, layout:str)->dict:
    "Rank function: train with the modules_to_save head as a unit; gather, stream, save and load it against peft."
    from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel as FSDP
    from peft.utils.other import ModulesToSaveWrapper as Wrapper
    cfg = WrapConfig(**MTS_LAYOUTS[layout])
    rank, d = dist.get_rank(), Path(folder)/f"mts-{layout}-{dist.get_world_size()}"
    res = dict(layout=layout, rank=rank, world=dist.get_world_size())
    try:
        fm = cfg.wrap(_mts_model())
        head = E.peft_model_of(fm).base_model.model.lm_head   # under FSDP1: the wrapper that replaced it
        res["head_is_unit"] = (isinstance(head, FSDPModule) and isinstance(head, Wrapper)
                               or isinstance(head, FSDP) and isinstance(head.module, Wrapper))
        train_steps(fm, 2)
        ref, res["ref_keys_ok"] = _mts_reference(fm, cfg.flavour)
        got = gather_lora(fm, progress=False)
        lb, ls = list(E.iter_lora_buckets(fm, bucket_bytes=1536)), list(E.iter_lora(fm))
        merged = dict(iter_merged_weights(fm, progress=False))
        E.save_lora(fm, d/"adapter")
        if rank == 0:   # rank 0 alone: an error here must not leave the others in the collectives below
            try: res.update(_mts_checks(ref, got, lb, ls, merged, d))
            except Exception: res["error"] = traceback.format_exc()
        res.update(loaded_back(fm, cfg.wrap(_mts_model()), got, d/"adapter"))
    except Exception:
        res["error"] = traceback.format_exc()
    return res

def loaded_back(fm, fresh, got:dict, folder:Path)->dict:
    "Collective: `fresh` (wrapped, untrained) differs from `got`, equals it after `load_lora`, then steps as `fm` does."
    out = dict(differs_before=not _equal(gather_lora(fresh, progress=False), got))
    out["loaded"] = E.load_lora(fresh, folder)
    out["load_equal"] = _equal(gather_lora(fresh, progress=False), got)
    out["next"] = (train_steps(fm, 1, start=2), train_steps(fresh, 1, start=2))
    return out

def modules_to_save_units(folder:str, layouts:tuple=tuple(MTS_LAYOUTS))->list[dict]:
    "Rank function: `modules_to_save_unit` for each layout, in one launch."
    return [modules_to_save_unit(folder, l) for l in layouts]


def everything(folder:str, settings:tuple, fault_settings:tuple, gather_fault:tuple)->dict:
    """Rank function, the file's one launch per world: `run(settings)`, the faults of each of `fault_settings`, and
    last (it closes the group) those of `gather_fault` = (setting, failing rank) with the fault inside the gather;
    at 3 ranks also `beyond_cases.run`; the modules_to_save units of `MTS_AT`."""
    out = dict(run=run(folder, settings), faults={})
    out["modules_to_save"] = modules_to_save_units(folder, MTS_AT[dist.get_world_size()])
    if dist.get_world_size() == 3: out["beyond"] = beyond_cases.run(os.path.join(folder, "beyond"))   # uneven shards
    for s in fault_settings: out["faults"][s, None] = faults(folder, s)
    out["faults"][tuple(gather_fault)] = faults(folder, *gather_fault)
    return out

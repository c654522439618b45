"""Rank-side cases for tests/test_nothing_lost.py. The ranks are processes the test forks itself, on a TCP store the
test hosts (as `torchrun` or a cluster scheduler starts them: not the kit's `launch`, which would stop the survivors
of a killed rank itself). Faults are injected where a user meets them: Ctrl-C at each stage of a load, SIGKILL at
each stage of a save, a load and a bucket stream, a rank that is only slow, a stream abandoned on one rank."""
from __future__ import annotations

import json, multiprocessing as mp, os, signal, sys, tempfile, time, traceback
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
from torch import nn

import lora_fsdp_kit.export.core as E
from lora_fsdp_kit.gather.core import gather_lora
from lora_fsdp_kit.models import tiny_model
from lora_fsdp_kit.gather.votes import RankVote

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])

def lora_model(version:int=0)->nn.Module:
    "The tiny Llama with LoRA on q/v; every LoRA tensor random, a function of `version` (the same on every rank)."
    pm = get_peft_model(tiny_model("llama", seed=0), LoraConfig(**LORA))
    g = torch.Generator().manual_seed(100 + version)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_" in n: p.copy_(torch.randn(p.shape, generator=g) * 0.1)
    return pm

def wrap(pm:nn.Module, flavour:str)->nn.Module:
    "FSDP2 on every decoder layer and the root, or FSDP1 with decoder-layer units (use_orig_params): torch's own."
    layers = pm.base_model.model.model.layers
    if flavour == "fsdp2":
        from torch.distributed.fsdp import fully_shard
        for layer in layers: fully_shard(layer)
        return fully_shard(pm)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FSDP(pm, auto_wrap_policy=ModuleWrapPolicy({type(layers[0])}), device_id=torch.device("cpu"),
                use_orig_params=True)

def _main(fn, rank:int, world:int, port:int, out:str, args:tuple):
    "A forked rank: its stderr to a file, a process group on the test's store, `fn`'s result as JSON; then exit."
    code = 1
    try:
        err = os.open(f"{out}/{rank}.stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(err, 2); sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)   # not pytest's capture
        import logging; logging.getLogger().handlers.clear()   # a plain process: not pytest's capturing handlers
        torch.set_num_threads(1)
        store = dist.TCPStore("127.0.0.1", port, world, False, timeout=__import__("datetime").timedelta(seconds=60))
        dist.init_process_group("gloo", store=dist.PrefixStore("job/", store), rank=rank, world_size=world)
        res = fn(rank, world, out, *args)
        Path(f"{out}/{rank}.json").write_text(json.dumps(res))
        code = 0
    except BaseException:
        Path(f"{out}/{rank}.json").write_text(json.dumps({"crash": traceback.format_exc()}))
    finally:
        sys.stderr.flush()
        os._exit(code)   # a forked child of pytest: none of the parent's exit handlers may run here

def start_all(fn, world:int, argsets:list[tuple], timeout:float=180)->list[list[dict|None]]:
    """Fork `world` ranks for each argument tuple, every case at once, each on a store hosted here; per case the ranks'
    results (None: killed). Every rank is forked from this one thread: forking from several threads at once can leave
    a child holding a lock that no thread of its own will release."""
    runs = []
    for args in argsets:
        store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
        out = tempfile.mkdtemp(prefix="lfk_lost_")
        procs = [mp.get_context("fork").Process(target=_main, args=(fn, r, world, store.port, out, args))
                 for r in range(world)]
        for p in procs: p.start()
        runs.append((store, out, procs))
    end = time.monotonic() + timeout
    for _, _, procs in runs:
        for p in procs:
            p.join(max(0.1, end - time.monotonic()))
            if p.is_alive(): p.kill(); p.join()
    return [_results(out, world) for _, out, _ in runs]

def _results(out:str, world:int)->list[dict|None]:
    res = []
    for r in range(world):
        f = Path(f"{out}/{r}.json")
        row = json.loads(f.read_text()) if f.exists() else None
        if row is not None:
            row.update(stderr=Path(f"{out}/{r}.stderr").read_text(), out=out)
            if Path(f"{out}/killed").exists(): row["killed_at"] = float(Path(f"{out}/killed").read_text())
        res.append(row)
    return res

def start(fn, world:int, *args, timeout:float=180)->list[dict|None]:
    "Fork `world` ranks running `fn(rank, world, out, *args)` on a store hosted here: their results (None: killed)."
    return start_all(fn, world, [args], timeout)[0]

def _equal(a:dict, b:dict)->int: return sum(torch.equal(a[k], b[k]) for k in a)

def _error(e:BaseException)->str:
    notes = " | ".join(getattr(e, "__notes__", []))
    return f"{type(e).__name__}: {e}" + (f" [{notes}]" if notes else "")

# --- Ctrl-C (and an exception) at each stage of load_lora, on each rank -----------------------------------------

def _interrupts(stage:str, victim:int, rank:int):
    "The patches that stop rank `victim` at `stage` of load_lora (the others: slow where that makes it deterministic)."
    me = rank == victim
    real_check, real_failures, real_read, real_write = RankVote.check, RankVote.failures, E._read_pieces, E._write_pieces
    def check(self, st, *a, **k):
        real_check(self, st, *a, **k)
        if me and stage == "start" and self.name == "load_lora" and st == "start": raise KeyboardInterrupt   # after it
    def read(*a, **k):
        res = real_read(*a, **k)
        if me: raise KeyboardInterrupt
        return res
    def write(pieces, done):
        if not me and stage == "waiting": time.sleep(0.5)   # the victim is the first to wait
        if me and stage in ("write", "exception"):
            real_write(pieces[:len(pieces) // 2], done)
            raise KeyboardInterrupt if stage == "write" else RuntimeError("injected: a copy failed")
        real_write(pieces, done)
    def failures(self, st):
        if me and self.name == "load_lora" and st == "written":
            if stage == "waiting": raise KeyboardInterrupt
            if stage == "after the word":   # every rank arrived; the interrupt comes once another rank committed
                real_failures(self, st)
                key = self._key(st, "decision")
                while not self.store.check([key]): time.sleep(0.01)
                raise KeyboardInterrupt
        return real_failures(self, st)
    clean = lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt())
    return [mock.patch.object(RankVote, "check", check), mock.patch.object(RankVote, "failures", failures),
            mock.patch.object(E, "_read_pieces", read if stage == "read" else real_read),
            mock.patch.object(E, "_write_pieces", write)] + (
           [mock.patch.object(E, "clean_leftovers", clean)] if stage == "ready" and me else [])

def load_interrupts(rank:int, world:int, out:str, flavour:str, cases:list[tuple[str, int]])->dict:
    "Each (stage, victim): load adapter B over A with the fault on `victim`; what each rank raised, and the gather."
    model = wrap(lora_model(0), flavour)
    a, b = Path(out)/"a", Path(out)/"b"
    E.save_lora(model, a)                                # version 0 (A), saved from the shards
    if rank == 0: lora_model(1).save_pretrained(b)       # version 1 (B), by plain peft
    dist.barrier()
    A, B = gather_lora(model, progress=False), None
    if rank == 0: B = get_peft_model_state_dict(lora_model(1))
    rows = []
    for stage, victim in cases:
        patches = _interrupts(stage, victim, rank)
        for p in patches: p.start()
        try: E.load_lora(model, b); err = None
        except BaseException as e: err = _error(e)
        finally:
            for p in patches: p.stop()
        got = gather_lora(model, progress=False)
        rows.append(dict(stage=stage, victim=victim, error=err, n=len(got), same_a=_equal(got, A),
                         same_b=_equal(got, B) if B is not None else None))
        E.load_lora(model, a)                            # back to A for the next case
    return dict(rows=rows)

# --- SIGKILL at each stage; a slow rank ----------------------------------------------------------------------------

def _kill(out:str):
    Path(f"{out}/killed").write_text(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)

def killed(rank:int, world:int, out:str, op:str, stage:str, victim:int, flavour:str="fsdp2")->dict:
    "Run `op` (save, load, stream) with rank `victim` killed outright at `stage`; the survivors' error and timing."
    model, me = wrap(lora_model(0), flavour), rank == victim
    target, src = Path(out)/"adapter", Path(out)/"b"
    if rank == 0:   # a previous adapter in the target (version 2), what a save of the model writes, a file to load
        lora_model(2).save_pretrained(target); lora_model(0).save_pretrained(Path(out)/"new")
        lora_model(1).save_pretrained(src); __import__("shutil").copytree(target, Path(out)/"a-before")
    dist.barrier()
    local = lambda: {k: (v.to_local() if hasattr(v, "to_local") else v).detach().clone()   # this rank's own shards
                     for k, v in model.state_dict().items() if "lora_" in k}            # (no collective)
    before = local()
    real_post, real_failures, real_write, real_pieces = RankVote.post, RankVote.failures, E.write_adapter, E._write_pieces
    def post(self, st, err=None):
        if me and st == "written" and (stage == "after the gather" or stage == "voting" and op == "load"): _kill(out)
        return real_post(self, st, err)
    def failures(self, st):   # save: killed after it posted its vote (rank 0 then publishes, and finds it gone)
        if me and stage == "voting" and st == "written" and op == "save": _kill(out)
        return real_failures(self, st)
    def write(*a, **k):
        if me and stage == "writing": real_write(*a, **k); _kill(out)
        return real_write(*a, **k)
    def write_pieces(pieces, done):
        if me and stage == "writing": _kill(out)
        if me and stage == "slow": time.sleep(11)      # slow, not dead: longer than `dead_after` and 10 s
        return real_pieces(pieces, done)
    res, t0 = dict(rank=rank), time.time()
    with mock.patch.object(RankVote, "post", post), mock.patch.object(RankVote, "failures", failures), \
         mock.patch.object(E, "write_adapter", write), mock.patch.object(E, "_write_pieces", write_pieces):
        try:
            if op == "save": E.save_lora(model, target)
            elif op == "load": res["loaded"] = E.load_lora(model, src)
            else:
                for i, bucket in enumerate(E.iter_lora_buckets(model, bucket_bytes=1024)):
                    if me and i == 1: _kill(out)
            res["error"] = None
        except BaseException as e: res["error"] = _error(e)
    res["raised_at"] = time.time()
    res["seconds"] = res["raised_at"] - t0
    if op == "load": res["kept_own_shards"] = all(torch.equal(v, before[k]) for k, v in local().items())
    return res

# --- a stream abandoned on one rank, a skipped call -----------------------------------------------------------------

def parted(rank:int, world:int, out:str, flavour:str="fsdp2")->dict:
    "Rank 1 raises inside a bucket stream, keeps the generator and retries with gather_lora; then a skipped save."
    model = wrap(lora_model(0), flavour)
    truth = gather_lora(model, progress=False)
    res, kept = dict(rank=rank), []
    t0 = time.time()
    try:
        stream = E.iter_lora_buckets(model, bucket_bytes=1024)
        for i, bucket in enumerate(stream):
            if rank == 1 and i == 1: raise RuntimeError("injected: the engine refused the bucket")
        res["stream"] = "finished"
    except RuntimeError as e:
        if "injected" not in str(e): res["stream"] = _error(e)
        else:
            kept.append((e, stream))                      # the generator stays alive (in the kept traceback too)
            try:
                got = gather_lora(model, progress=False)
                res["retry"] = f"returned {len(got)} tensors, {_equal(got, truth)} equal to the model's"
            except BaseException as e2: res["retry"] = _error(e2)
    res["seconds"] = time.time() - t0
    # a rank that skips a save: rank 1 goes on to load while rank 0 saves
    try:
        if rank == 0: E.save_lora(model, Path(out)/"skipped")
        else: E.load_lora(model, Path(out)/"missing")
        res["skip"] = None
    except BaseException as e: res["skip"] = _error(e)
    return res

# --- what sits beside an adapter -----------------------------------------------------------------------------------

def save_targets(rank:int, world:int, out:str, flavour:str, targets:list[str])->dict:
    "Save version 1 from the shards into each target in turn; each target's error (None: saved)."
    model, res = wrap(lora_model(1), flavour), {}
    for t in targets:
        try: E.save_lora(model, t); res[t] = None
        except BaseException as e: res[t] = _error(e)
    return res

# --- whatever state a forward left the units in ---------------------------------------------------------------------

def _wrap_state(pm:nn.Module, state:str)->nn.Module:
    "FSDP2 with reshard_after_forward True/False, FSDP2 on the root alone, FSDP1 FULL_SHARD or SHARD_GRAD_OP."
    layers = pm.base_model.model.model.layers
    if state.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard
        reshard = state != "fsdp2-keep"
        if state != "fsdp2-root":
            for layer in layers: fully_shard(layer, reshard_after_forward=reshard)
        return fully_shard(pm, reshard_after_forward=reshard)
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    return FSDP(pm, auto_wrap_policy=ModuleWrapPolicy({type(layers[0])}), device_id=torch.device("cpu"),
                use_orig_params=True, sharding_strategy=ShardingStrategy.SHARD_GRAD_OP if state == "fsdp1-grad-op"
                else ShardingStrategy.FULL_SHARD)

def forward_states(rank:int, world:int, out:str, states:list[str])->dict:
    "After an eval forward, and after a train forward and backward: gather, save and load, each against peft."
    from safetensors.torch import load_file
    ref, new = get_peft_model_state_dict(lora_model(0)), get_peft_model_state_dict(lora_model(1))
    src = Path(out)/"b"
    if rank == 0: lora_model(1).save_pretrained(src)
    dist.barrier()
    rows, ids = [], torch.arange(12).reshape(2, 6)
    for state in states:
        for mode in ("eval", "train"):
            row = dict(state=state, mode=mode)
            try:
                model = _wrap_state(lora_model(0), state)
                if mode == "eval":
                    model.eval()
                    with torch.no_grad(): model(input_ids=ids)
                else: model(input_ids=ids).logits.sum().backward()
                got = gather_lora(model, progress=False)
                row["gather"] = list(got) == list(ref) and _equal(got, ref) == len(ref)
                E.save_lora(model, Path(out)/f"{state}-{mode}")
                if rank == 0: row["save"] = _equal(load_file(Path(out)/f"{state}-{mode}"/E.ADAPTER_WEIGHTS), ref) == len(ref)
                E.load_lora(model, src)
                row["load"] = _equal(gather_lora(model, progress=False), new) == len(new)
                model.eval()   # the next forward computes with the loaded adapter (no stale unsharded copy)
                with torch.no_grad(): logits = model(input_ids=ids).logits
                with torch.no_grad(): want = lora_model(1).eval()(input_ids=ids).logits
                row["forward"] = bool(torch.allclose(logits, want, atol=1e-5))
            except BaseException as e: row["error"] = _error(e)[:600]
            rows.append(row)
    return dict(rows=rows)

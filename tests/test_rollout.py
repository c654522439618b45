"""`lora_fsdp_kit.rollout.core` against a real engine (vLLM's CPU build, float32): each trap of issue 32 is first reproduced
the naive way, then handled by the kit, and every version trained under FSDP1 (here; FSDP2: the chapter's picture) is
served as HF transformers + peft serve it (identical greedy tokens, |Δlogprob| < 1e-3). Runs where vLLM is installed
(`make test-vllm`)."""
import gc, os, tempfile

import pytest
import torch

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")            # GiB; unset, the engine asks for 90 % of RAM
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")    # the engine core in this process (one test: a child)
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
try: import vllm  # noqa: F401
except ImportError:
    if os.environ.get("LFK_REQUIRE_VLLM") == "1": raise       # `make test-vllm` sets it: a skip would hide a failure
    pytest.skip("vllm is not installed here; `make test-vllm` runs these tests in its own environment",
                allow_module_level=True)

from peft import set_peft_model_state_dict
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest

from lora_fsdp_kit.rollout import core as R, vllm as V; from lora_fsdp_kit.testing import rollout_runs as RR

PROMPTS = [list(range(3, 73)) + [100 + i, 7 * i + 1] for i in range(2)]   # 70 shared tokens: two full KV blocks
N = 6                                                                     # greedy tokens per prompt

def test_a_moe_model_is_refused_in_one_line():
    """vLLM's CPU build runs a MoE model's experts through Triton kernels once LoRA is on, and reloads expert weights in a
    layout its kernels do not read: the kit refuses both, naming the modules."""
    # first, and in this process: vLLM's parallel state is process-wide, so its engine goes, state and all, before
    # the module's engine starts (a child process for it cost a second import of vLLM: ~20 s of this job)
    from lora_fsdp_kit.models import add_lora, model_from_config
    from lora_fsdp_kit.config_files import shipped_config
    from peft import get_peft_model_state_dict
    cfg = {**shipped_config("qwen3_moe"), **RR.CHAPTER_CONFIG, "vocab_size": 512}
    folder = tempfile.mkdtemp(); model_from_config(cfg, device="cpu", seed=0).save_pretrained(folder)
    ref = add_lora(model_from_config(cfg, device="cpu", seed=0), r=8, alpha=16)   # attention only
    llm = LLM(**V.engine_args(folder, max_model_len=128, block_size=32))
    try:
        assert V._in_process(llm)
        with pytest.raises(NotImplementedError, match=r"vLLM's CPU build serves no LoRA on a MoE model: .* 2 expert "
                                                      r"layers \(model\.layers\.0\.mlp\.experts, "):
            R.push_lora(llm, get_peft_model_state_dict(ref), ref.peft_config["default"], name="moe")
        # merged weights: a reload of expert weights put them over the layout the CPU MoE kernels packed at start,
        # and the engine served other tokens for good (|Δlogprob| 0.17-0.20, even for its own weights reloaded): the
        # MoE blocks' tensors are refused before any reload of them; the tensors outside them are taken
        base = model_from_config(cfg, device="cpu", seed=0).state_dict()
        with pytest.raises(ValueError, match=r"push_merged refused bucket \d+: \d+ tensors lie in MoE blocks of the "
                                             r"engine's Qwen3MoeForCausalLM \(model\.layers\.0\.mlp\..*vLLM's CPU "
                                             r"build reloads expert weights"):
            R.push_merged(llm, base.items())
        assert R.push_merged(llm, [(n, t) for n, t in base.items() if ".mlp." not in n]) > 0
    finally:
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory
        llm.llm_engine.engine_core.shutdown(); del llm; gc.collect()
        cleanup_dist_env_and_memory()

@pytest.fixture(scope="module")
def engine():
    "One in-process engine for the module, on the chapter's tiny Llama, and the HF + peft reference beside it."
    folder = tempfile.mkdtemp()
    ref = RR.chapter_model(folder)
    llm = LLM(**V.engine_args(folder, max_model_len=128, block_size=32, max_cpu_loras=10))   # a name per test
    yield llm, ref, folder
    llm.llm_engine.engine_core.shutdown(); del llm
    # importing vLLM leaves ~700K objects that the interpreter's last collections walk at exit (10-30 s of this job,
    # measured): frozen, they are skipped; nothing after this module needs them collected
    gc.freeze()

def adapter(ref, seed:int)->dict:
    "A version of the reference's adapter: lora_B drawn anew from `seed`; the reference is set to it."
    from peft import get_peft_model_state_dict
    g = torch.Generator().manual_seed(seed)
    sd = {k: (torch.randn(v.shape, generator=g) * 0.05 if "lora_B" in k else v.clone())
          for k, v in get_peft_model_state_dict(ref).items()}
    set_peft_model_state_dict(ref, sd)
    return sd

def served_ok(llm, req, ref, prompts=PROMPTS)->bool:
    "The engine serves `ref` under `req`: the same greedy tokens, logprobs within 1e-3."
    same, diff, _ = RR.served_vs_trained(llm, req, ref, prompts, N)
    return same and diff < 1e-3

def worker(llm, fn, *args):
    "Run `fn(worker, *args)` inside the in-process engine's worker: the naive way, without the kit."
    return llm.collective_rpc(fn, args=args)[0]

def _naive_add(w, lid, tensors, cfg):
    "Build and register an adapter from the caller's tensors as vLLM's worker code does; no copy, no pin."
    from vllm.lora.lora_model import LoRAModel
    from vllm.lora.peft_helper import PEFTHelper
    wm = w.model_runner.lora_manager
    helper = PEFTHelper.from_dict({**cfg, "vllm_max_position_embeddings": wm.max_position_embeddings})
    lora = LoRAModel.from_lora_tensors(lora_model_id=lid, tensors=tensors, peft_helper=helper, device="cpu",
                                       dtype=wm.lora_config.lora_dtype, model_vocab_size=wm.vocab_size)
    wm._adapter_manager.remove_adapter(lid)
    return wm._adapter_manager.add_adapter(lora)

def _listed(w): return sorted(w.model_runner.lora_manager.list_adapters())

def cfg(ref)->dict: return R.lora_config_dict(ref.peft_config["default"])

def test_callers_tensors_are_never_changed(engine):
    llm, ref, _ = engine
    sd = adapter(ref, 1); keep = {k: v.clone() for k, v in sd.items()}
    worker(llm, _naive_add, 900, sd, cfg(ref))                               # the trap: vLLM scales lora_B in place
    assert [k for k in sd if not torch.equal(sd[k], keep[k])] and all("lora_B" in k for k in sd
                                                                         if not torch.equal(sd[k], keep[k]))
    worker(llm, lambda w: w.model_runner.lora_manager._adapter_manager.remove_adapter(900))
    sd = adapter(ref, 1)
    keep = {k: v.clone() for k, v in sd.items()}
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="a")
    assert all(torch.equal(sd[k], keep[k]) for k in sd)                      # the kit's copy
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="a")         # the same dict again: still right
    assert served_ok(llm, req, ref)
    assert R.certify(llm, req, sd, ref, probe=PROMPTS[0]).max_logprob_diff < 1e-3

def test_a_new_version_never_serves_a_stale_prefix(engine):
    llm, ref, _ = engine
    v1 = adapter(ref, 2)
    req = R.push_lora(llm, v1, ref.peft_config["default"], name="b")
    assert served_ok(llm, req, ref)                                           # the prefix is now cached under v1
    v2 = adapter(ref, 3)
    # the trap: v2 under the same request (name and path), as an in-place swap does, is served from v1's cached KV
    worker(llm, V.RolloutWorker.lfk_add_lora, req.lora_int_id, R.pack(v2), cfg(ref))
    assert not served_ok(llm, req, ref)
    llm.reset_prefix_cache()
    assert served_ok(llm, req, ref)                                           # it was the cache, not the weights
    set_peft_model_state_dict(ref, v1); served_ok(llm, R.push_lora(llm, v1, cfg(ref), name="b"), ref)   # cache v1
    set_peft_model_state_dict(ref, v2)
    req2 = R.push_lora(llm, v2, ref.peft_config["default"], name="b")        # the kit: a new version, no stale KV
    assert req2.lora_path != req.lora_path and served_ok(llm, req2, ref)
    assert req.lora_int_id not in worker(llm, _listed)                        # the old version is gone

def merged_by_hand(ref, base)->dict:
    "The reference's adapter merged into `base` by hand (W + s B A): what the engine must serve with no adapter."
    merged = {n: t.clone() for n, t in base}
    for n, m in ref.get_base_model().named_modules():
        if hasattr(m, "lora_A") and "default" in m.lora_A:
            merged[n + ".weight"] = merged[n + ".weight"] + m.scaling["default"] * (
                m.lora_B["default"].weight @ m.lora_A["default"].weight).detach()
    return merged

def test_merged_push_keeps_the_adapters_it_drops(engine):
    llm, ref, _ = engine
    sd = adapter(ref, 4)
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="c")
    base = RR._base_weights(ref)
    worker(llm, lambda w, ws: w.reload_weights(weights_iterator=iter(ws)), base)   # the trap: a plain reload
    assert req.lora_int_id not in worker(llm, _listed)                        # drops every adapter
    R.push_lora(llm, sd, ref.peft_config["default"], name="c")               # (the kit's state: pushed again)
    req = R._state(llm).live["c"].request
    merged = merged_by_hand(ref, base)
    assert R.push_merged(llm, merged.items()) == len(merged)
    assert served_ok(llm, None, ref)                                          # merged base, no adapter: as trained
    R.push_merged(llm, base)
    assert req.lora_int_id in worker(llm, _listed) and served_ok(llm, req, ref)   # the adapter, pushed again
    R.certify(llm, req, sd)

def test_merged_buckets_never_split_a_fused_group(engine):
    "vLLM's CPU reload repacks q/k/v (and gate/up) from one call: buckets must hold each fused group whole."
    llm, ref, _ = engine
    adapter(ref, 9)
    base = RR._base_weights(ref)
    merged = merged_by_hand(ref, base)
    for pair in merged.items():                                               # the trap: one tensor per reload
        V._rpc(llm, "lfk_reload_weights", R.pack([pair]))
    llm.reset_prefix_cache()
    assert not served_ok(llm, None, ref)                                      # q alone lost k and v: wrong tokens
    fused = V._rpc(llm, "lfk_fused")
    assert fused == {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    parts = {p: f for f, ps in fused.items() for p in ps}
    group = lambda n: ".".join(parts.get(b, b) for b in n.split("."))
    buckets = [[n for n, _ in b] for b in R.fused_buckets(merged.items(), fused, 1)]   # the smallest buckets
    homes = {}
    for i, b in enumerate(buckets):
        for n in b: homes.setdefault(group(n), set()).add(i)
    assert len(buckets) == len(homes) < len(merged) and all(len(h) == 1 for h in homes.values())   # groups whole
    assert R.push_merged(llm, merged.items(), bucket_bytes=1) == len(merged)
    assert R._state(llm).reloads == len(buckets) and served_ok(llm, None, ref)  # the kit's buckets: served right
    R.push_merged(llm, base, bucket_bytes=64 << 10)                          # the base back, in 64 KiB buckets
    with ref.disable_adapter():
        assert R._state(llm).reloads > 1 and served_ok(llm, None, ref)

def test_a_bad_merged_stream_is_refused_before_the_engine_sees_it(engine):
    "vLLM's reload fails half way on a name or shape its model lacks (layers left on meta: the engine fails or hangs"
    " from then on), and serves a layer loaded in part (q and v without k) half-initialised: the kit refuses first."
    llm, ref, _ = engine
    base = RR._base_weights(ref)
    R.push_merged(llm, base)
    q = "model.layers.0.self_attn.q_proj.weight"
    adapter(ref, 12); merged = merged_by_hand(ref, base)
    for stream, says in [([("base_model.model." + q.replace(".weight", ".base_layer.weight"), merged[q])],
                          "names are not parameters of the engine's LlamaForCausalLM"),
                         ([(q, merged[q][:, :-1])], f"{q} is {tuple(merged[q][:, :-1].shape)}, not {tuple(merged[q].shape)}"),
                         ([(q, merged[q]), (q.replace("q_proj", "v_proj"), merged[q.replace("q_proj", "v_proj")])],
                          "without model.layers.0.self_attn.k_proj.weight")]:
        with pytest.raises(ValueError, match="push_merged refused bucket 1: .*" + says.replace("(", r"\(").replace(")", r"\)")):
            R.push_merged(llm, stream)
    with ref.disable_adapter():
        assert served_ok(llm, None, ref)                                      # the base, as before: nothing loaded

def test_an_adapter_that_does_not_fit_is_refused(engine):
    "vLLM copies a short lora_A or lora_B into its slot zero-padded, and serves it: a rank's shards, not gathered."
    llm, ref, _ = engine
    sd = adapter(ref, 13)
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="g")
    shards = {k: v[: v.shape[0] // 2].clone() for k, v in sd.items()}        # what an FSDP2 rank holds of each
    with pytest.raises(ValueError, match=r"the adapter does not fit the engine's model in (\d+) of \1 modules: .* \(a "
                                         r"rank's shards\? push the gathered adapter"):
        R.push_lora(llm, shards, ref.peft_config["default"], name="g")
    lone = {k: v for k, v in sd.items() if not k.endswith("layers.1.self_attn.o_proj.lora_B.weight")}
    with pytest.raises(ValueError, match=r"1 adapted modules have one of lora_A and lora_B: base_model\.model\.model"
                                         r"\.layers\.1\.self_attn\.o_proj"):
        R.push_lora(llm, lone, ref.peft_config["default"], name="g")
    assert R._state(llm).live["g"].request == req and served_ok(llm, req, ref)   # the last good version serves on

def test_certify_an_adapter_on_the_head(engine):
    "peft keeps a LoRA'd head's (or embedding's) base weight in the adapter's state dict; vLLM skips it, so does certify."
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM
    llm, _, folder = engine
    head = get_peft_model(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                          LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "lm_head"])).eval()
    g = torch.Generator().manual_seed(14)
    sd = {k: (torch.randn(v.shape, generator=g) * 0.05 if "lora_B" in k else v.clone())
          for k, v in get_peft_model_state_dict(head).items()}
    set_peft_model_state_dict(head, sd)
    assert "base_model.model.lm_head.base_layer.weight" in sd
    req = R.push_lora(llm, sd, head.peft_config["default"], name="h")
    assert served_ok(llm, req, head)
    assert R.certify(llm, req, sd, head, probe=PROMPTS[0]).tensors == len([k for k in sd if ".base_layer." not in k])
    # certify scores an adapter on lm_head as sampled tokens get it (public threads: prompt logprobs dropped its
    # delta); on vLLM 0.32 both carry it, and the head's delta is far above the bound
    want = R.reference_logprobs(head, PROMPTS[0])
    with head.disable_adapter(): base = R.reference_logprobs(head, PROMPTS[0])
    for sampled in (True, False):
        assert (V.served_logprobs(llm, req, PROMPTS[0], sampled=sampled) - want).abs().max() < 1e-3
    assert (want - base).abs().max() > 0.1

def test_a_pushed_adapter_is_never_evicted(engine):
    llm, ref, folder = engine
    sd = adapter(ref, 5)
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="d")
    worker(llm, _naive_add, 901, sd, cfg(ref))                               # unpinned, as vLLM adds it
    disk = os.path.join(folder, "disk_adapter"); ref.save_pretrained(disk)
    sp = SamplingParams(max_tokens=1, temperature=0.0)
    for i in range(10):                                                       # more adapters than the cache holds
        llm.generate([{"prompt_token_ids": PROMPTS[0]}], sp, lora_request=LoRARequest(f"disk{i}", 1000 + i, disk),
                     use_tqdm=False)
    listed = worker(llm, _listed)
    assert 901 not in listed                                                  # the trap: evicted, unreloadable
    assert req.lora_int_id in listed and served_ok(llm, req, ref)             # the kit's: pinned

def test_an_adapter_that_binds_nothing_is_refused(engine):
    llm, ref, _ = engine
    req = R.push_lora(llm, adapter(ref, 11), ref.peft_config["default"], name="e")
    stray = {"base_model.model.model.layers.0.mlp.no_such_proj.lora_A.weight": torch.zeros(8, 128),
             "base_model.model.model.layers.0.mlp.no_such_proj.lora_B.weight": torch.zeros(128, 8)}
    with pytest.raises(ValueError, match="the engine has no LoRA layer for 1 of 1 adapted modules: "
                                         "model.layers.0.mlp.no_such_proj"):
        R.push_lora(llm, stray, ref.peft_config["default"], name="e")
    # refused under a live name: the version it would have replaced serves on (it was removed before the check)
    assert R._state(llm).live["e"].request == req and served_ok(llm, req, ref)

def test_certify_names_what_differs(engine):
    llm, ref, _ = engine
    sd = adapter(ref, 6)
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="f")
    cert = R.certify(llm, req, sd, ref, probe=PROMPTS[0])
    assert cert.tensors == 8 * 2 and cert.probes == len(PROMPTS[0]) - 1 and cert.max_weight_diff < 1e-6
    def corrupt(w, lid):
        lora = w.model_runner.lora_manager._adapter_manager._registered_adapters[lid]
        lora.loras["model.layers.1.self_attn.o_proj"].lora_b.mul_(1.5)
    worker(llm, corrupt, req.lora_int_id)
    with pytest.raises(R.CertifyError, match=r"differs in 1 tensors: base_model\.model\.model\.layers\.1\.self_attn"
                                             r"\.o_proj\.lora_B\.weight"):
        R.certify(llm, req, sd)
    old, req = req, R.push_lora(llm, sd, ref.peft_config["default"], name="f")
    with pytest.raises(R.CertifyError, match=r"'f' \(id \d+\) is not served by this engine: a newer push replaced it"):
        R.certify(llm, old, sd)                                               # was: KeyError from inside the worker
    assert R.certify(llm, req, list(sd.items())).tensors == 16               # the pairs push_lora takes
    adapter(ref, 7)                                                           # the reference now holds another version
    with pytest.raises(R.CertifyError, match="served logprobs differ from the reference by up to"):
        R.certify(llm, req, sd, ref, probe=PROMPTS[0])

def _zero_slot(w, lid, layer):
    "What sleep(level=2) + wake_up() was reported to leave: one layer's LoRA buffers emptied, the adapter still active."
    am = w.model_runner.lora_manager._adapter_manager
    i, mod = am.lora_index_to_id.index(lid), am.modules[layer]
    for t in mod.lora_b_stacked: t[i].zero_()

def test_certify_reads_the_buffers_the_kernels_read(engine):
    "After sleep(1), and sleep(2) + wake_up(), certify passes while the engine serves the adapter, raises when not."
    llm, ref, _ = engine
    sd = adapter(ref, 12)
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="s")
    cert = R.certify(llm, req, sd, ref, probe=PROMPTS[0])
    assert cert.layers == 10 and cert.workers == 1    # every LoRA layer: 4 adapted, 6 whose slot must stay empty
    for level in (1, 2):                                                   # no-ops on the CPU build: still served
        llm.sleep(level=level); llm.wake_up()
        assert served_ok(llm, req, ref) and R.certify(llm, req, sd, ref, probe=PROMPTS[0]).layers == 10
    worker(llm, _zero_slot, req.lora_int_id, "model.layers.1.self_attn.qkv_proj")
    assert not served_ok(llm, req, ref)                                    # the engine serves something else ...
    with pytest.raises(R.CertifyError, match=r"worker 0 of 1: the buffers its LoRA kernels read for 's' differ from "
                                             r"its copy in 1 of 10 layers \(model\.layers\.1\.self_attn\.qkv_proj\)"):
        R.certify(llm, req, sd)                                            # ... and certify says where, weights alone
    req = R.push_lora(llm, sd, ref.peft_config["default"], name="s")       # the fix it names
    assert served_ok(llm, req, ref) and R.certify(llm, req, sd, ref, probe=PROMPTS[0])

def _corrupt_on(w, rank, lid, what):
    "On worker `rank` only: scale o_proj's B in the registered copy, or empty its slot (`what`)."
    if w.rank != rank: return
    am = w.model_runner.lora_manager._adapter_manager
    if what == "copy": am._registered_adapters[lid].loras["model.layers.1.self_attn.o_proj"].lora_b.mul_(1.5)
    else: _zero_slot(w, lid, "model.layers.0.self_attn.o_proj")

def test_tensor_parallel_2_every_worker_is_certified(engine, monkeypatch):
    """Tensor parallel 2 on the CPU build (an engine core and 2 workers, each its own process; tensors cross as bytes,
    the kit's methods by name): each worker's copy and buffers are read, and a difference on worker 1 is named."""
    _, ref, folder = engine
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")          # the test's own corrupting function
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "0|1"))  # 1 NUMA node
    import vllm.envs
    vllm.envs.disable_envs_cache()   # an in-process engine core froze vLLM's variables as they were when it started
    llm = LLM(**V.engine_args(folder, max_model_len=128, block_size=32, tensor_parallel_size=2))
    try:
        assert not V._in_process(llm)
        sd = adapter(ref, 8)
        req = R.push_lora(llm, sd, ref.peft_config["default"], name="g")
        cert = R.certify(llm, req, sd, ref, probe=PROMPTS[0])
        assert served_ok(llm, req, ref) and (cert.workers, cert.layers) == (2, 10)
        llm.collective_rpc(_corrupt_on, args=(1, req.lora_int_id, "copy"))
        with pytest.raises(R.CertifyError, match=r"worker 1 of 2: its copy of 'g' differs in 1 tensors: base_model\."
                                                 r"model\.model\.layers\.1\.self_attn\.o_proj\.lora_B\.weight"):
            R.certify(llm, req, sd)
        req = R.push_lora(llm, sd, ref.peft_config["default"], name="g")
        R.certify(llm, req, sd, ref, probe=PROMPTS[0])                     # loads it into a slot
        llm.collective_rpc(_corrupt_on, args=(1, req.lora_int_id, "slot"))
        with pytest.raises(R.CertifyError, match=r"worker 1 of 2: the buffers its LoRA kernels read for 'g' differ "
                                                 r"from its copy in 1 of 10 layers \(model\.layers\.0\.self_attn"):
            R.certify(llm, req, sd)
        req = R.push_lora(llm, sd, ref.peft_config["default"], name="g")
        base = RR._base_weights(ref)
        assert R.push_merged(llm, base, bucket_bytes=64 << 10) == len(base)   # as bytes, in buckets; the adapter again
        assert R._state(llm).reloads > 1 and served_ok(llm, req, ref) and R.certify(llm, req, sd).workers == 2
    finally:
        llm.llm_engine.engine_core.shutdown(); del llm; gc.collect()

# FSDP2's loop, launched once per version so that training, pushing and generating take turns, is the rollout
# chapter's picture, which `make test-vllm` runs with the same checks (nbs/13_rollout). Here FSDP1's 5 versions come
# from one launch (a launch of 2 ranks costs 5-15 s), then each is pushed and served in turn.
@pytest.mark.parametrize("flavour", ["fsdp1"])
def test_every_version_is_served_as_trained(engine, flavour):
    "Issue 32's loop: train 5 versions on 2 ranks, push and generate each; merged weights at version 2."
    from lora_fsdp_kit.launch import launch
    llm, ref, _ = engine
    records = launch(RR.train_versions, flavour, versions=5, quiet=True)[0]
    rows = RR.serve_versions(llm, records, ref, PROMPTS, name=f"policy-{flavour}")
    assert [r["world"] for r in records] == [2] * 5      # real ranks, though this process holds vLLM's own group
    assert len(records) == 5 and all(not torch.equal(a["lora"][k], b["lora"][k]) for a, b in zip(records, records[1:])
                                     for k in a["lora"] if "lora_B" in k)   # each version trained further
    assert [(r.version, r.kind) for r in rows] == [(0, "lora"), (1, "lora"), (2, "lora"), (2, "merged"),
                                                   (3, "lora"), (4, "lora")]
    assert all(r.same_tokens for r in rows), rows
    assert max(r.max_logprob_diff for r in rows) < 1e-3, [r.max_logprob_diff for r in rows]
    assert all(0 < r.trainer_peak <= r.trainer_bound for r in rows), [(r.trainer_peak, r.trainer_bound) for r in rows]

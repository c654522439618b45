"""Every line of every answer `lfk` prints fits in 100 columns, and nothing that carries the answer is cut ("…"):
`plan` for every shipped model and the Llama-3-8B shape, `fits` (its rows, a refusal, the legend) and
`fits --max-batch` / `--max-seq` (their header and search lines). The CLI's `main` runs in this process.

Sampled, not every model x every command (a trace of a full-size model takes seconds): `plan` for every shipped model
and Llama-3-8B (no trace); `fits` on the tiny models (the search on llama and qwen2) and one 8B row with an FSDP1
refusal beside it. `fits --check` is left out: it steps a reduced copy on real CPU ranks (tests/test_cli.py)."""
import contextlib, io, json, re

import pytest

from lora_fsdp_kit.__main__ import main
from lora_fsdp_kit.config_files import shipped_names

WIDTH = 100
LLAMA3_8B = dict(model_type="llama", architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
                 num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                 max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5, torch_dtype="bfloat16")

@pytest.fixture(scope="module")
def llama3_8b(tmp_path_factory)->str:
    "A folder holding the Llama-3-8B config.json (the meta device builds it; nothing is downloaded)."
    d = tmp_path_factory.mktemp("llama3_8b")
    (d/"config.json").write_text(json.dumps(LLAMA3_8B))
    return str(d)

def answer(*argv:str)->tuple[int, str, str]:
    "`lfk ARGV` in this process: (exit code, stdout, stderr)."
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err): rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()

def check_width(text:str, cut:str="…"):
    "Every line <= 100 columns, and nothing cut (`cut` nowhere): a long name wraps or is said in the legend."
    wide = [l for l in text.splitlines() if len(l) > WIDTH]
    assert not wide, f"{len(wide)} line(s) over {WIDTH} columns, the widest {max(map(len, wide))}:\n" + "\n".join(wide)
    assert not re.search(cut, text), [l for l in text.splitlines() if re.search(cut, l)]

@pytest.mark.parametrize("name", shipped_names() + ["llama3_8b"])
def test_plan_answer(name, request):
    config = request.getfixturevalue("llama3_8b") if name == "llama3_8b" else None
    rc, out, err = answer("plan", *(("--config", config) if config else ("--model", name)))
    assert rc in (0, 1) and out.startswith("job: "), out + err
    # the plan's table shortens a long module path in its middle ('base_model.….thinker.model.audio_tower'), the
    # unit's own name kept whole: no word may end cut
    check_width(out, r"…(\s|$)"); check_width(err)

FITS = "fits", "--world", "2", "--reserve", "0B", "--seq", "64"

def test_fits_rows_refusals_and_legend():
    "The default sweep (FSDP2, FSDP1 x checkpointing off, on) with fp32 LoRA on a bf16 base: FSDP1's rows refused."
    rc, out, err = answer(*FITS, "--model", "llama", "--device-memory", "64MiB", "--param-dtype", "bfloat16",
                          "--lora-dtype", "float32")
    check_width(out); check_width(err)
    assert rc == 1 and out.count("cannot predict fsdp1:layer") == 2, out   # refused: the rows left are FSDP2's
    assert "store=bfloat16" not in out and "base stored in bf16, LoRA stored in fp32" in " ".join(out.split()), out
    assert "params bf16, LoRA fp32" in out, out   # the job's line says the storage swept, as the user knows it
    legend = out.split("\nsettings:\n")[1].splitlines()
    assert [l.split(" = ")[1].split(",")[0] for l in legend] == ["FSDP2 on layer units"] * 2, legend
    refusal = out.split("cannot predict fsdp1:layer orig;")[1].split("cannot predict")[0]
    assert "fix: " in refusal and "(--align-lora-dtype)" in refusal and "why: FSDP refuses it (mixed-dtype)" in refusal

def test_fits_a_lone_setting_says_it_in_words():
    rc, out, err = answer(*FITS, "--model", "qwen2", "--device-memory", "1GiB", "--flavour", "fsdp2",
                          "--activation-checkpointing", "on")
    check_width(out)
    assert rc == 0 and "\nsettings:\n  1 = FSDP2 on layer units\n" in out and "= ;" not in out, out

@pytest.mark.parametrize("search,model", [("batch", "llama"), ("seq", "llama")])
def test_fits_search_header_rows_and_lines(search, model):
    "`--max-batch` / `--max-seq` over two settings: the header names the searched size in words, each row its answer."
    # 3 MiB: both answers below the tiny Llama's 256 positions, where a sequence search stops (the model's context)
    rc, out, err = answer("fits", "--world", "2", "--reserve", "0B", "--model", model, "--device-memory", "3MiB",
                          f"--max-{search}", "--flavour", "fsdp2", "--activation-checkpointing", "off,on",
                          "--use-cache", "off",   # a recompute under checkpoint_wrapper meets the cache it filled
                          *(("--seq", "64") if search == "batch" else ("--batch", "2")))
    check_width(out); check_width(err)
    assert rc == 0 and "?x" not in out and "x?" not in out, out
    flat = " ".join(out.split())
    size = "batch largest that fits x seq 64" if search == "batch" else "batch 2 x seq largest that fits"
    assert f"every setting: FSDP2 on layer units, bf16 compute, base stored in config.json's dtype, {size}" in flat
    found = [l for l in out.splitlines() if l[:3] in ("1: ", "2: ")]
    assert len(found) == 2 and all(f"largest {search} " in l and " traces" in l for l in found), out
    rows = out.split("#  setting")[1].splitlines()[1:3]
    for i, (row, line) in enumerate(zip(rows, found)):   # each row at the value its search found
        n = line.split(f"largest {search} ")[1].split(":")[0]
        assert row.startswith(f"{i + 1}  ") and (f"{n}x64" if search == "batch" else f"2x{n}") in row, (row, line)

def test_fits_llama3_8b(llama3_8b):
    "The 8B shape at world 8: its header (a long path, 8 billion parameters), one row, FSDP1 refused beside it."
    rc, out, err = answer("fits", "--config", llama3_8b, "--world", "8", "--device-memory", "80GiB",
                          "--activation-checkpointing", "on", "--lora-dtype", "fp32")
    check_width(out); check_width(err)
    assert rc == 1 and "8,030,261,248 parameters" in " ".join(out.split()), out
    assert "cannot predict fsdp1:layer orig; fix:" in out and "1 = FSDP2 on layer units" in out, out

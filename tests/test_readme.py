"""README.md is exactly what nbs/index.ipynb renders to, with its pictures committed; its first screen shows the kit's
picture and a plan of a real config, then how to install, then the two commands (demo, test) that .ci/run and a new
user rely on; every command it shows for a fresh clone runs as written."""
import re, subprocess
from pathlib import Path
from lora_fsdp_kit.__main__ import render_readme

ROOT = Path(__file__).resolve().parents[1]

def test_readme_in_sync_with_index_notebook():
    images = {}
    assert (ROOT/"README.md").read_text() == render_readme(ROOT/"nbs/index.ipynb", images), \
        "README.md is stale: run `make export` (or `python -m lora_fsdp_kit readme`) and commit it"
    assert images, "the README shows no picture"
    for path, png in images.items():
        assert (ROOT/path).exists() and (ROOT/path).read_bytes() == png, f"{path} is stale: run `make export`"
    tracked = subprocess.run(["git", "ls-files", "nbs/images"], cwd=ROOT, capture_output=True, text=True).stdout
    assert all(p in tracked for p in images), f"commit the README's pictures: {sorted(images)}"

def test_readme_first_screen():
    text = (ROOT/"README.md").read_text()
    why = text.index("\n## Why")
    first_picture = text.index("![")
    assert first_picture < text.index("\n## "), "the picture comes before any section"
    assert "plan_command(config=" in text[:first_picture], "three lines that plan the reader's config.json"
    install = text.index("\n## Install")
    assert install < why and "pip install" in text[install:why]
    blocks = re.findall(r"```sh\n(.*?)```", text[:why], re.S)
    cmds = [[l.split("#")[0].strip() for l in b.splitlines() if l.strip()] for b in blocks]
    assert ["make demo", "make test"] in cmds, cmds
    mk = (ROOT/"Makefile").read_text()
    assert re.search(r"^demo:", mk, re.M) and re.search(r"^test:", mk, re.M) and re.search(r"^book:", mk, re.M)
    assert "torch==2.13.0" in mk                     # torch is pinned and installed first
    assert "make test" in (ROOT/".ci/run").read_text()

def test_fresh_clone_commands_are_venv_paths_or_make():
    "Shell commands for a fresh clone use make or .venv/bin/ (bare torchrun/python/lfk are not on a fresh PATH)."
    text = (ROOT/"README.md").read_text()
    start = text.index("\n## From a script")
    for block in re.findall(r"```(?:sh|bash)\n(.*?)```", text[start:], re.S):
        for line in filter(None, (l.split("#")[0].strip() for l in block.splitlines())):
            assert line.startswith((".venv/bin/", "make ")), line
    assert "runs/" in (ROOT/".gitignore").read_text()   # the script guide writes runs/demo

def test_library_is_what_the_notebooks_export(tmp_path):
    "nbdev_export on a copy of the tree changes no module (no hand edits, no missed export)."
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for f in files:
        (tmp_path/f).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path/f).write_bytes((ROOT/f).read_bytes())
    exe = Path(__import__("sys").executable).parent/"nbdev_export"
    subprocess.run([str(exe)], cwd=tmp_path, check=True, capture_output=True)
    changed = [f for f in files if f.startswith("lora_fsdp_kit/") and f.endswith(".py")
               and (tmp_path/f).read_bytes() != (ROOT/f).read_bytes()]
    assert not changed, f"library differs from the notebooks' export: {changed}"

def test_readme_python_examples_run_as_written(tmp_path):
    """Every Python example of the README runs as written, in order, in one fresh interpreter in an empty folder (no
    file of the repository's, no hidden set-up cell), except sketches that name the reader's own model ("your/...")."""
    import sys
    text = (ROOT/"README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    runnable = [b for b in blocks if "your/" not in b]
    assert len(runnable) >= 4 and any("plan_command(" in b for b in runnable), len(runnable)
    sketches = [b for b in blocks if "your/" in b]
    assert not sketches or "examples/train_save_load.py" in text   # the sketches name their runnable version
    script = "import matplotlib; matplotlib.use('Agg')\n" + "\n".join(
        f"print('--- block {i}', flush=True)\n{b}" for i, b in enumerate(runnable))
    r = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=600,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "FSDP1 plan of Qwen3OmniMoeForConditionalGeneration" in r.stdout
    assert list(tmp_path.iterdir()) == [], "an example left files behind"

def _site_packages(python:str)->str:
    return subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()

def test_install_commands_run_where_shown(tmp_path):
    """The Install section's commands, in the order shown, in a user's own environment: a fresh venv holding torch and
    the kit's dependencies already (this project's, added by a .pth file: the test downloads nothing), the repository
    cloned, `pip install ./lora_fsdp_kit` (`--no-deps --no-build-isolation`: nothing to fetch), then each `lfk` line run
    by the name the README gives it, with the environment's bin/ first on PATH as an activated environment has it, and
    `path/to/config.json` a shipped config file. Then the project-venv line of the `make` section, `.venv/bin/lfk`."""
    import os, sys
    text = (ROOT/"README.md").read_text()
    section = text[text.index("\n## Install"):text.index("\n## Why")]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = [l.split("#")[0].strip() for l in block.splitlines() if l.split("#")[0].strip()]
    assert lines[0].startswith("git clone") and lines[1] == "pip install ./lora_fsdp_kit", lines
    assert all(l.startswith("lfk ") for l in lines[2:]) and len(lines) >= 4, lines
    env_dir = tmp_path/"env"
    subprocess.run([sys._base_executable, "-m", "venv", str(env_dir)], check=True, timeout=120)
    (Path(_site_packages(str(env_dir/"bin/python")))/"user_stack.pth").write_text(_site_packages(sys.executable) + "\n")
    subprocess.run(["git", "clone", "-q", str(ROOT), str(tmp_path/"lora_fsdp_kit")], check=True, timeout=120)
    subprocess.run([str(env_dir/"bin/python"), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "./lora_fsdp_kit"], cwd=tmp_path, check=True, timeout=300, capture_output=True)
    assert (env_dir/"bin/lfk").exists(), "pip put no lfk command in the environment's bin/"
    config = str(tmp_path/"lora_fsdp_kit/lora_fsdp_kit/configs/llama.json")
    env = {**os.environ, "PATH": f"{env_dir/'bin'}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1",
           "VIRTUAL_ENV": str(env_dir)}
    for line in lines[2:]:
        args = line.replace("path/to/config.json", config).split()
        if "--max-batch" in args:   # one setting's search, not four (the same code; test_answer_width runs it whole)
            args += ["--flavour", "fsdp2", "--activation-checkpointing", "off"]
        r = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, f"{line}: exit {r.returncode}\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}"
        print(line, "->", r.stdout.strip().splitlines()[0][:100])
    # the package lfk ran is the one pip installed into the environment, not the repository's
    where = subprocess.run([str(env_dir/"bin/python"), "-c", "import lora_fsdp_kit; print(lora_fsdp_kit.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in where, where
    make_cmds = [l.split("#")[0].strip() for b in re.findall(r"```sh\n(.*?)```", section, re.S) for l in b.splitlines()]
    venv_lines = [l for l in make_cmds if l.startswith(".venv/bin/lfk")]
    assert venv_lines, "the make section shows how to run lfk from the project's .venv"
    for line in venv_lines:
        r = subprocess.run(line.split(), cwd=ROOT, capture_output=True, text=True, timeout=600,
                           env={**os.environ, "OMP_NUM_THREADS": "1"})
        assert r.returncode in (0, 1), f"{line}: exit {r.returncode}\n{r.stderr[-1500:]}"   # 1: a ✖ finding

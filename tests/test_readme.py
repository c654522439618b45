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

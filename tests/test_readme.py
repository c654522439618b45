"""README.md is exactly what nbs/index.ipynb renders to, and it opens with the two commands (demo, test) that .ci/run and a new user rely on."""
import re, subprocess
from pathlib import Path
from lora_fsdp_kit.__main__ import render_readme

ROOT = Path(__file__).resolve().parents[1]

def test_readme_in_sync_with_index_notebook():
    assert (ROOT/"README.md").read_text() == render_readme(ROOT/"nbs/index.ipynb"), \
        "README.md is stale: run `make export` (or `python -m lora_fsdp_kit readme`) and commit it"

def test_readme_opens_with_the_two_commands():
    text = (ROOT/"README.md").read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, re.S)
    assert first_block and text.index("```sh") < text.index("\n## "), "the commands must come before any section"
    cmds = [l.split("#")[0].strip() for l in first_block.group(1).splitlines() if l.strip()]
    assert cmds == ["make demo", "make test"]
    mk = (ROOT/"Makefile").read_text()
    assert re.search(r"^demo:", mk, re.M) and re.search(r"^test:", mk, re.M)
    assert "torch==2.13.0" in mk                     # torch is pinned and installed first
    assert "make test" in (ROOT/".ci/run").read_text()

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

"""Execute notebooks in place (`make docs`), so that the repository shows the book with its outputs.

Each notebook runs top to bottom in a fresh kernel of this Python (cwd: its folder), as `nbdev_test` runs it, except
that the outputs are kept. Cells that nbdev does not run (`#| eval: false`, and `#| vllm` outside the vLLM venv)
are not run here either. Widget views are
dropped from the outputs: their model ids are random on every run (the diff would churn), and with no saved widget
state a viewer could not draw them anyway; the kit's widgets carry a text and a PNG fallback that stay.
Usage: python tools/execute_notebooks.py [NOTEBOOK ...]   (default: every nbs/*.ipynb)
"""
import re, sys, time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
SKIP_TAG = "skip-execution"
NO_EVAL = re.compile(r"^#\|\s*(eval:\s*false|vllm)\b", re.M)   # `#| vllm`: run in the vLLM venv (make test-vllm)

def execute(path:Path, timeout:int=1200)->float:
    "Run one notebook in place; returns the seconds it took."
    nb = nbformat.read(path, as_version=4)
    tagged = []
    for c in nb.cells:
        if c.cell_type == "code" and NO_EVAL.search(c.source) and SKIP_TAG not in c.metadata.get("tags", []):
            c.metadata.setdefault("tags", []).append(SKIP_TAG); tagged.append(c)
    t0 = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False, skip_cells_with_tag=SKIP_TAG,
                   resources={"metadata": {"path": str(path.parent.resolve())}}).execute()
    for c in tagged:
        c.metadata["tags"].remove(SKIP_TAG)
        if not c.metadata["tags"]: del c.metadata["tags"]
    for c in nb.cells:
        for o in c.get("outputs", []):
            if WIDGET_VIEW in o.get("data", {}):
                del o["data"][WIDGET_VIEW]
                if not o["data"]: o["data"]["text/plain"] = "(an interactive widget: run the notebook to use it)"
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - t0

if __name__ == "__main__":
    paths = [Path(p) for p in sys.argv[1:]] or sorted(Path("nbs").glob("*.ipynb"))
    for p in paths:
        print(f"executing {p} ...", flush=True)
        print(f"  {p}: {execute(p):.0f} s", flush=True)

"""The notebooks are committed executed (`make docs`): every cell that draws shows a picture, no cell shows an
error or a bare `<Figure size …>` text, and the whole book stays small enough to read on a code host."""
import ast, re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT/"nbs").glob("*.ipynb"))
LIMIT = 8 * 2**20                                   # bytes, all notebooks together
DRAWS = re.compile(r"\bplot_\w*\(|\.plot\(|\bexplore\(|\bnew_figure\(")
BARE_FIGURE = re.compile(r"^<(matplotlib\.figure\.)?Figure size [\d.]+x[\d.]+ with \d+ Axes>$")

def _code(cell)->str:
    "The cell's Python, without nbdev directives and IPython magics."
    return "\n".join(l for l in cell.source.splitlines() if not l.lstrip().startswith(("#|", "%", "!")))

def _shows_result(cell)->bool:
    "True when the cell ends with a bare expression (not `;`-silenced), so Jupyter displays its value."
    src = _code(cell).rstrip()
    if not src or src.endswith(";"): return False
    try: tree = ast.parse(src)
    except SyntaxError: return False
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr): return False
    # a call to print/display/test helpers shows no value of its own
    if isinstance(last.value, ast.Call) and getattr(last.value.func, "id", "") in ("print", "display") \
       or isinstance(last.value, ast.Call) and getattr(last.value.func, "id", "").startswith("test_"): return False
    return True

def drawing_cells(nb)->list:
    "Code cells that draw and end by showing the drawing."
    return [c for c in nb.cells if c.cell_type == "code" and DRAWS.search(_code(c)) and _shows_result(c)]

def _outputs(nb):
    for i, c in enumerate(nb.cells):
        if c.cell_type == "code":
            for o in c.get("outputs", []): yield i, c, o

@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_committed_executed(path):
    nb = nbformat.read(path, as_version=4)
    shown = [c for c in nb.cells if c.cell_type == "code" and _shows_result(c)]
    # a value-showing cell may legitimately show nothing (a call returning None): any output proves the execution
    assert not shown or any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        f"{path.name} is committed without outputs: run `make docs` (executes the notebooks in place) and commit"
    for i, c in enumerate(nb.cells):
        if c in drawing_cells(nb):
            kinds = {k for o in c.get("outputs", []) for k in o.get("data", {})}
            assert "image/png" in kinds, f"{path.name} cell {i} draws but shows no picture: {kinds or 'no output'}"
    for i, c, o in _outputs(nb):
        assert o.output_type != "error", f"{path.name} cell {i}: {o.get('ename')}: {o.get('evalue')}"
        text = o.get("data", {}).get("text/plain", "") if o.output_type != "stream" else o.get("text", "")
        text = "".join(text) if isinstance(text, list) else text
        for line in text.splitlines():
            assert not BARE_FIGURE.match(line.strip()) or "image/png" in o.get("data", {}), \
                f"{path.name} cell {i} shows {line.strip()!r} instead of a picture"
        assert "Traceback (most recent call last)" not in text, f"{path.name} cell {i} prints a traceback"

def test_book_size():
    total = sum(p.stat().st_size for p in NOTEBOOKS)
    assert total < LIMIT, f"notebooks take {total/2**20:.1f} MiB together (limit 8 MiB): draw smaller figures"

def test_checks_can_fail(tmp_path):
    "The checks above catch a drawing cell without a picture, and a bare Figure text."
    nb = nbformat.v4.new_notebook()
    c = nbformat.v4.new_code_cell("fig = plot_plan(plan)\nfig")
    c.outputs = [nbformat.v4.new_output("execute_result", data={"text/plain": "<Figure size 1100x424 with 2 Axes>"},
                                        execution_count=1)]
    nb.cells = [c, nbformat.v4.new_code_cell("fig = plot_plan(plan);"), nbformat.v4.new_code_cell("print(plot_x(1))")]
    assert drawing_cells(nb) == [c]
    p = tmp_path/"x.ipynb"; nbformat.write(nb, p)
    with pytest.raises(AssertionError, match="draws but shows no picture"): test_notebook_is_committed_executed(p)
    c.outputs[0]["data"]["image/png"] = "iVBORw0KGgo="; nbformat.write(nb, p)
    test_notebook_is_committed_executed(p)          # the picture is there; its text/plain alternative is fine
    c.outputs.append(nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[]))
    nbformat.write(nb, p)
    with pytest.raises(AssertionError, match="ValueError: boom"): test_notebook_is_committed_executed(p)

"""The kit's modules form floors in the book's reading order: a module imports only from its own floor or lower ones
(the notebook's number, `03b_checks` is floor 3), never from `__main__`, and the import graph has no circle. Every
import counts, those inside functions too, read from the exported sources with `ast`."""
import ast, re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KIT = "lora_fsdp_kit"

def floors()->dict[str, tuple[int, str]]:
    "module -> (floor, notebook) from each notebook's `default_exp`."
    out = {}
    for nb in sorted((ROOT/"nbs").glob("*.ipynb")):
        m = re.search(r"default_exp\s+([\w.]+)", nb.read_text())
        if m and re.match(r"\d+", nb.stem): out[m.group(1)] = (int(re.match(r"\d+", nb.stem).group()), nb.stem)
    return out

def imports_of(module:str, known:set[str], source:str|None=None)->list[tuple[str, int]]:
    "(kit module imported, line) for every import in `module`'s source, function-level ones included."
    out = []
    for node in ast.walk(ast.parse(source if source is not None else (ROOT/KIT/f"{module}.py").read_text())):
        names = []
        if isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            if node.level: names = [mod] if mod else [a.name for a in node.names]
            elif mod == KIT: names = [a.name for a in node.names]
            elif mod.startswith(KIT + "."): names = [mod.split(".")[1]]
            elif mod == "__main__": names = ["__main__"]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] if a.name.startswith(KIT + ".") else a.name for a in node.names]
        out += [(n.split(".")[0], node.lineno) for n in names if n.split(".")[0] in known and n.split(".")[0] != module]
    return out

def graph()->dict[str, list[tuple[str, int]]]:
    fl = floors()
    return {m: imports_of(m, set(fl) | {"__main__"}) for m in fl}

def cycles(g:dict[str, list[tuple[str, int]]])->list[list[str]]:
    "Strongly connected components of more than one module (Tarjan), each sorted."
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1; stack.append(v); on.add(v)
        for w, _ in g.get(v, []):
            if w not in index: visit(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    for v in g:
        if v not in index: visit(v)
    return out

def upward(g:dict[str, list[tuple[str, int]]])->list[str]:
    "One line per import from a lower floor to a higher one (or of `__main__` from a library module)."
    fl = floors()
    return [f"{a}.py:{line} ({fl[a][1]}) imports {b} ({fl[b][1] if b in fl else '__main__'})"
            for a, deps in g.items() for b, line in deps
            if (b == "__main__" and a != "__main__") or (b in fl and fl[b][0] > fl[a][0])]

def test_every_module_has_a_floor():
    mods = {p.stem for p in (ROOT/KIT).glob("*.py")} - {"__init__", "_modidx"}
    assert mods <= set(floors()), f"modules with no numbered notebook: {sorted(mods - set(floors()))}"

def test_no_upward_import():
    up = upward(graph())
    assert not up, "imports from a lower floor to a higher one (move the thing imported down):\n" + "\n".join(up)

def test_no_import_circle():
    cs = cycles(graph())
    assert not cs, f"{len(cs)} import circle(s): " + "; ".join(" <-> ".join(c) for c in cs)

def test_the_checker_sees_circles_and_function_level_imports():
    assert cycles({"a": [("b", 1)], "b": [("c", 2)], "c": [("a", 3)], "d": [("a", 4)]}) == [["a", "b", "c"]]
    assert cycles({"a": [("b", 1)], "b": []}) == []
    src = ("from .shards import clean_name\nimport lora_fsdp_kit.wrap as W\n"
           "def f():\n    from lora_fsdp_kit.models import x\n    from __main__ import PLAN_TARGETS\n")
    got = imports_of("plan", {"shards", "wrap", "models", "__main__"}, src)
    assert got == [("shards", 1), ("wrap", 2), ("models", 4), ("__main__", 5)], got   # function-level ones too
    fl = floors()
    assert upward({"models": [("__main__", 3)], "plan": [("shards", 1)]}) == [
        f"models.py:3 ({fl['models'][1]}) imports __main__ ({fl['__main__'][1]})"]   # an upward import, named

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

def _resolve(module:str, node:ast.ImportFrom)->list[str]:
    "The dotted names (below the kit) an import statement in `module` reads: `from ..fits.core import x` -> fits.core."
    if node.level:
        base = module.split(".")[:len(module.split(".")) - node.level]   # the package `module` sits in, climbed
        mod = ".".join(base + ([node.module] if node.module else []))
    elif node.module == KIT: mod = ""
    elif (node.module or "").startswith(KIT + "."): mod = node.module[len(KIT) + 1:]
    elif node.module == "__main__": return ["__main__"]
    else: return []
    return [f"{mod}.{a.name}".strip(".") for a in node.names] + ([mod] if mod else [])

def imports_of(module:str, known:set[str], source:str|None=None)->list[tuple[str, int]]:
    "(kit module imported, line) for every import in `module`'s source, function-level ones included."
    out = []
    path = ROOT/KIT/(module.replace(".", "/") + ".py")
    for node in ast.walk(ast.parse(source if source is not None else path.read_text())):
        if isinstance(node, ast.ImportFrom): names = _resolve(module, node)
        elif isinstance(node, ast.Import):
            names = [a.name[len(KIT) + 1:] if a.name.startswith(KIT + ".") else a.name for a in node.names]
        else: continue
        # the module a name lies in: itself if it is one, else its longest known prefix (`fits.core.x` -> fits.core)
        hits = []
        for n in names:
            parts = n.split(".")
            m = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in known), None)
            if m and m != module and m not in hits: hits.append(m)
        if hits and any(h in names for h in hits): hits = [h for h in hits if h in names]   # `from p import m`: m
        out += [(h, node.lineno) for h in hits]
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
    mods = {".".join(p.relative_to(ROOT/KIT).with_suffix("").parts) for p in (ROOT/KIT).rglob("*.py")}
    mods = {m for m in mods if not m.split(".")[-1].startswith("_")}   # packages' docstrings, nbdev's index
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
    src = ("from ..shards import clean_name\nimport lora_fsdp_kit.plan.wrap as W\nfrom . import wrap\n"
           "def f():\n    from lora_fsdp_kit.models import x\n    from __main__ import PLAN_TARGETS\n"
           "    from lora_fsdp_kit.fits import core\n")
    got = imports_of("plan.core", {"shards", "plan.wrap", "models", "fits.core", "__main__"}, src)
    assert got == [("shards", 1), ("plan.wrap", 2), ("plan.wrap", 3), ("models", 5), ("__main__", 6),
                   ("fits.core", 7)], got   # relative, dotted and function-level imports
    fl = floors()
    assert upward({"models": [("__main__", 3)], "plan.core": [("shards", 1)]}) == [
        f"models.py:3 ({fl['models'][1]}) imports __main__ ({fl['__main__'][1]})"]   # an upward import, named

MAX_PRIVATE_IMPORTS = 10   # issue 49: what two modules share is a public, documented name of one of them (44 -> 0)

def private_imports()->list[str]:
    "One line per private name (`_x`) a module imports from another kit module."
    out = []
    for m in floors():
        for node in ast.walk(ast.parse((ROOT/KIT/(m.replace(".", "/") + ".py")).read_text())):
            if isinstance(node, ast.ImportFrom) and (res := _resolve(m, node)) and res[-1] != m:
                out += [f"{m} imports {res[-1]}.{a.name}" for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    return out

def test_few_private_names_cross_modules():
    found = private_imports()
    assert len(found) <= MAX_PRIVATE_IMPORTS, f"{len(found)} private names imported across modules " \
        f"(at most {MAX_PRIVATE_IMPORTS}: make the shared one public and documented, or fold the halves):\n" + "\n".join(found)

def test_private_import_check_can_fail():
    node = ast.parse("from ..fits.core import _unit, plot\n").body[0]
    assert _resolve("fits.report", node)[-1] == "fits.core"   # the module the names come from

# ---- issue 49: the walk from `WrapConfig.plan` to its plan. A move: a call from one kit module into another (the caller
# is the nearest kit frame, so torch's callbacks into the kit count from the module that handed them over), each pair
# of modules once; a climb: a move into a lower floor. The goal is <= 7 moves and <= 3 climbs, held here at what it is
# (2026-12-07: 5 moves, 3 climbs — wrap -> core, wrap -> policies, policies -> families (layer classes), core -> shards
# (names), core -> routing (experts); was 8 and 5, then 6 and 4: a parameter's dtype is named as torch names it, and
# its item size is read from `dtypes` where bytes are counted, not while the plan is built).
MAX_PLAN_MOVES, MAX_PLAN_CLIMBS = 5, 3

def kit_walk(fn)->tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    "The (caller module, callee module) moves between kit modules while `fn()` runs, in order, and those that climb."
    import sys
    mod = lambda f: (f.f_globals.get("__name__", "") or "").removeprefix(KIT + ".") \
        if f is not None and (f.f_globals.get("__name__") or "").startswith(KIT + ".") else None
    moves = []
    def prof(frame, event, arg):
        if event != "call" or (m := mod(frame)) is None: return
        f = frame.f_back
        while f is not None and mod(f) is None: f = f.f_back
        if f is not None and (c := mod(f)) != m and (c, m) not in moves: moves.append((c, m))
    sys.setprofile(prof)
    try: fn()
    finally: sys.setprofile(None)
    fl = floors()
    return moves, [(a, b) for a, b in moves if a in fl and b in fl and fl[b][0] < fl[a][0]]

def test_the_plan_walk_stays_short():
    from lora_fsdp_kit.models import tiny_lora_model
    from lora_fsdp_kit.plan.wrap import WrapConfig
    pm = tiny_lora_model("llama")
    for cfg in (WrapConfig(), WrapConfig(flavour="fsdp1", policy="lora")):   # layer units; LoRA leaves | layers
        cfg.plan(pm)   # once before: caches and lazy imports are not the walk
        moves, climbs = kit_walk(lambda: cfg.plan(pm))
        assert moves[0] == ("plan.wrap", "plan.core"), moves   # the door's first step: the plan's own module
        assert len(moves) <= MAX_PLAN_MOVES and len(climbs) <= MAX_PLAN_CLIMBS, \
            f"{cfg.label}: {len(moves)} moves, {len(climbs)} climbs (at most {MAX_PLAN_MOVES}, {MAX_PLAN_CLIMBS}): {moves}"

def test_the_walk_sees_moves_and_climbs():
    from lora_fsdp_kit.models import tiny_lora_model
    from lora_fsdp_kit.plan.policies import resolve_layer_classes
    pm = tiny_lora_model("llama")
    moves, climbs = kit_walk(lambda: resolve_layer_classes(pm, "auto"))
    assert ("plan.policies", "families") in climbs and climbs == [m for m in moves if m[1] == "families"], moves

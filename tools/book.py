"""Render the committed, executed notebooks in `nbs/` to a static HTML book (`make book`), readable offline.

Every `nbs/*.ipynb` becomes one page (`index.ipynb` the front page, the rest in file-name order), titled by its first
`# ` heading. Each page has the chapters in a left sidebar, its own headings on the right, and prev/next links.
Export cells (`#| export`, `#| exporti`, `#| exports`) are folded under their signatures and one-line docstrings;
`#| hide` and `#| include: false` cells are left out, `#| echo: false` shows only the output, `#| output: false` only
the code. Pictures are embedded (data URIs), tables rendered, links to `XX_name.ipynb` point at `XX_name.html`,
links to other files of the repository at a highlighted copy of them, and a code span naming an exported function or
class links to its definition. No JavaScript, no CDN: one shipped stylesheet. nbdev's own docs need Quarto; this
needs only nbconvert's dependencies (mistune, pygments), which the dev extras install.
Usage: python tools/book.py [--out _book] [--nbs nbs] [--strict]
"""
from __future__ import annotations
import argparse, ast, base64, html, mimetypes, re, shutil, sys
from dataclasses import dataclass, field
from pathlib import Path

import mistune, nbformat
from nbconvert.filters.ansi import ansi2html
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer, TextLexer, get_lexer_by_name, get_lexer_for_filename
from pygments.util import ClassNotFound

ROOT = Path(__file__).resolve().parents[1]
FOLD = {"export", "exporti", "exports"}            # nbdev's export directives: folded under their signatures
DIRECTIVE = re.compile(r"^#\|\s*([\w-]+)\s*:?\s*(.*?)\s*$")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
HREF = re.compile(r'\b(href|src)=(["\'])(.*?)\2', re.S)

@dataclass
class Chapter:
    "One notebook as a page of the book."
    path: Path                                       # the notebook
    page: str                                        # its file name in the book: index.html, 03_plan.html …
    title: str                                       # its first `# ` heading
    nb: object = None                                # the notebook (nbformat)
    description: str = ""                            # nbdev's `> ` line under the title
    toc: list = field(default_factory=list)          # (level, id, text) of its headings
    ids: set = field(default_factory=set)            # every id on the page

def directives(src:str)->tuple[dict, str]:
    "A code cell's nbdev directives (the leading `#| name value` lines) and the source without them."
    d, lines = {}, src.splitlines()
    while lines and (m := DIRECTIVE.match(lines[0].strip())):
        d[m.group(1)] = m.group(2); lines.pop(0)
    return d, "\n".join(lines).strip("\n")

def slug(text:str, taken:set)->str:
    "A unique id for a heading, as pandoc (so Quarto, nbdev) makes it: `2. Saving an adapter` -> `saving-an-adapter`."
    s = re.sub(r"[^\w\-. ]", "", html.unescape(re.sub(r"<[^>]+>", "", text)).lower()).strip().replace(" ", "-")
    s = re.sub(r"^[^a-z]+", "", s)
    s, base, i = s or "section", s or "section", 1
    while s in taken: s, i = f"{base}-{i}", i + 1
    taken.add(s)
    return s

def chapters(nbs:Path)->list[Chapter]:
    "Every notebook of `nbs`: the front page (`index.ipynb`) first, then by file name; titles from `# ` headings."
    paths = sorted(nbs.glob("*.ipynb"), key=lambda p: (p.stem != "index", p.name))
    if not paths: raise FileNotFoundError(f"no notebooks in {nbs}")
    out = []
    for p in paths:
        nb = nbformat.read(p, as_version=4)
        md = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
        m = re.search(r"^# +(.+?)\s*$", md, re.M)
        d = re.search(r"^# .*\n+((?:> ?.*\n?)+)", md, re.M)
        out.append(Chapter(p, "index.html" if p.stem == "index" else f"{p.stem}.html", m.group(1) if m else p.stem,
                           nb, re.sub(r"^> ?", "", d.group(1), flags=re.M).strip() if d else ""))
    return out

# ---- export cells: the signature and docstring shown, the code folded
def _signature(fn:ast.FunctionDef|ast.AsyncFunctionDef, code:str, width:int=90)->str:
    "`def name(a, b=1, *, c=…)`: parameter names and short defaults, cut with `…` past `width` characters."
    a, parts = fn.args, []
    pos, kwd = a.posonlyargs + a.args, a.kwonlyargs
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults) + list(a.kw_defaults)
    text = lambda v: ast.get_source_segment(code, v) or ast.unparse(v)     # as written: 0o755, not 493
    short = lambda v: "" if v is None else "=" + (s if len(s := text(v)) <= 16 and "\n" not in s else "…")
    for i, p in enumerate(pos): parts.append(p.arg + short(defaults[i]))
    if a.vararg: parts.append("*" + a.vararg.arg)
    elif kwd: parts.append("*")
    for j, p in enumerate(kwd): parts.append(p.arg + short(defaults[len(pos) + j]))
    if a.kwarg: parts.append("**" + a.kwarg.arg)
    kw = "async def" if isinstance(fn, ast.AsyncFunctionDef) else "def"
    sig = f"{kw} {fn.name}({', '.join(parts)})"
    while len(sig) > width and len(parts) > 1:
        parts = parts[:-2] + ["…"] if parts[-1] == "…" else parts[:-1] + ["…"]
        sig = f"{kw} {fn.name}({', '.join(parts)})"
    return sig

def export_summary(code:str)->list[tuple[str, str, str|None]]:
    "What an export cell defines, as (signature, one-line docstring, anchor name) rows."
    try: tree = ast.parse(code)
    except SyntaxError: return [((code.splitlines() or ["(empty)"])[0], "", None)]
    rows, attached = [], {}
    for n in tree.body:                              # `Cls.meth = meth`: the method a def becomes
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Name):
            for t in n.targets:
                if isinstance(t, ast.Attribute): attached[n.value.id] = ast.unparse(t)
    for n in tree.body:
        doc = lambda: (ast.get_docstring(n) or "").strip().split("\n")[0]
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sig = _signature(n, code) + (f"  → {attached[n.name]}" if n.name in attached else "")
            rows.append((sig, doc(), n.name))
        elif isinstance(n, ast.ClassDef):
            bases = ", ".join(ast.unparse(b) for b in n.bases)
            rows.append((f"class {n.name}" + (f"({bases})" if bases else ""), doc(), n.name))
    public = [r for r in rows if not r[2].startswith("_")]      # private helpers only where nothing else is defined
    if rows: return public or rows
    names = [ast.unparse(t) for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
    mods = [m for m in dict.fromkeys(a.name if isinstance(n, ast.Import) else n.module or "." for n in tree.body
                                     if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names)
            if m != "__future__"]
    cut = lambda xs, k: ", ".join(xs[:k]) + (", …" if len(xs) > k else "")
    rows = [("imports " + cut(mods, 8), "", None)] if mods else []
    if names: rows.append((cut(names, 6) + " = …", "", None))
    return rows or [((code.splitlines() or ["(empty)"])[0], "", None)]

def exported_names(chs:list[Chapter])->dict[str, str]:
    "Every function or class an export cell defines -> `page#name`, for linking code spans to their definition."
    names = {}
    for ch in chs:
        for c in ch.nb.cells:
            d, code = directives(c.source) if c.cell_type == "code" else ({}, "")
            if FOLD & d.keys():
                for _, _, name in export_summary(code):
                    if name and not name.startswith("_"): names.setdefault(name, f"{ch.page}#{name}")
    return names

def code_html(code:str, lexer=None)->str:
    "Code highlighted by pygments (CSS classes; the stylesheet holds the colours)."
    return highlight(code, lexer or PythonLexer(), HtmlFormatter(nowrap=False, cssclass="highlight"))

class Renderer(mistune.HTMLRenderer):
    "Markdown as HTML: headings with ids (collected for the page's TOC), highlighted code, linked code spans."
    def __init__(self, book:"Book", ch:Chapter):
        super().__init__(escape=False)
        self.book, self.ch = book, ch
    def heading(self, text:str, level:int, **attrs)->str:
        i = slug(text, self.ch.ids)
        if level > 1: self.ch.toc.append((level, i, re.sub(r"<[^>]+>", "", text)))
        anchor = f'<a class="anchor" href="#{i}" aria-label="link to this section">#</a>'
        return f'<h{level} id="{i}">{text}{anchor}</h{level}>\n'
    def block_code(self, code:str, info:str|None=None)->str:
        try: lexer = get_lexer_by_name(info.split()[0]) if info else TextLexer()
        except ClassNotFound: lexer = TextLexer()
        return code_html(code, lexer)
    def codespan(self, text:str)->str:
        target = self.book.ref(text)
        code = f"<code>{html.escape(text)}</code>"
        if target and target.startswith(self.ch.page + "#"): target = target[len(self.ch.page):]
        return f'<a class="ref" href="{target}">{code}</a>' if target else code

class Book:
    "The notebooks of `nbs` rendered into `out`."
    def __init__(self, nbs:Path, out:Path, strict:bool=False):
        self.nbs, self.out, self.strict = Path(nbs).resolve(), Path(out), strict
        self.root = self.nbs.parent                     # the repository: files a chapter may link to
        self.chs = chapters(self.nbs)
        self.by_stem = {c.path.stem: c for c in self.chs}
        self.names = exported_names(self.chs)
        self.pages = {c.page for c in self.chs} | {"index.html"}
        self.modules = {m for c in self.chs for cell in c.nb.cells if cell.cell_type == "code"
                        for m in directives(cell.source)[0].get("default_exp", "").split(".")} - {""}
        self.title = self.by_stem["index"].title if "index" in self.by_stem else self.nbs.resolve().parent.name
        self.sources: dict[str, Path] = {}            # page name -> repository file linked from a chapter
        self.problems: list[str] = []

    def ref(self, text:str)->str|None:
        "Where a code span's name is defined: `gather_lora`, `gather.gather_lora()`, `Plan.units` (at Plan)."
        parts = text.removesuffix("()").split(".")
        if not all(p.isidentifier() for p in parts): return None
        if parts[-1] in self.names and (len(parts) == 1 or parts[-2] in self.modules): return self.names[parts[-1]]
        return next((self.names[p] for p in parts[:-1] if p[:1].isupper() and p in self.names), None)

    def problem(self, msg:str):
        print(f"book: WARNING: {msg}", file=sys.stderr); self.problems.append(msg)

    # ---- links and pictures
    def link(self, url:str, ch:Chapter, attr:str)->str:
        "A link or picture source as the book needs it (see the module docstring)."
        if not url or re.match(r"^([a-z][\w+.-]*:|#|//)", url, re.I): return url
        path, _, frag = url.partition("#")
        if path in self.pages or path in self.sources: return url      # already a page of the book
        target = (self.nbs/path).resolve()
        if attr == "src":
            if target.is_file():
                mime = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
                return f"data:{mime};base64,{base64.b64encode(target.read_bytes()).decode()}"
            self.problem(f"{ch.path.name}: picture {url!r} not found"); return url
        if target.suffix == ".ipynb" and target.parent == self.nbs and target.stem in self.by_stem:
            return self.by_stem[target.stem].page + (f"#{frag}" if frag else "")
        if target.is_file() and self.root in target.parents:
            rel = target.relative_to(self.root).as_posix()
            page = "src." + rel.replace("/", ".") + ".html"
            self.sources[page] = target
            return page + (f"#{frag}" if frag else "")
        self.problem(f"{ch.path.name}: link {url!r} points at nothing in the repository"); return url

    def rewrite(self, text:str, ch:Chapter)->str:
        "Every href/src of a piece of HTML through `link`; scripts dropped (the book runs no JavaScript)."
        text = re.sub(r"<script\b.*?</script>", "", text, flags=re.S | re.I)
        def sub(m):
            attr, q, url = m.groups()
            return f"{attr}={q}{html.escape(self.link(html.unescape(url), ch, attr))}{q}"
        return HREF.sub(sub, text)

    def markdown(self, src:str, ch:Chapter, attachments:dict|None=None)->str:
        for name, data in (attachments or {}).items():
            mime, b64 = next(iter(data.items()))
            src = src.replace(f"attachment:{name}", f"data:{mime};base64,{b64}")
        md = mistune.create_markdown(renderer=Renderer(self, ch),
                                     plugins=["table", "strikethrough", "url", "footnotes"])
        return self.rewrite(md(src), ch)

    # ---- cells
    def output(self, o, ch:Chapter)->str:
        "One output: a picture, HTML (tables), markdown or text."
        if o.output_type == "stream":
            return f'<pre class="out {"stderr" if o.name == "stderr" else "stdout"}">{ansi2html(o.text)}</pre>'
        if o.output_type == "error": return f'<pre class="out error">{ansi2html(chr(10).join(o.traceback))}</pre>'
        data = o.get("data", {})
        for mime in ("image/png", "image/jpeg", "image/gif"):
            if mime in data:
                w = o.get("metadata", {}).get(mime, {}).get("width")
                b64 = "".join(data[mime].split())
                width = f' width="{w}"' if w else ""
                return f'<img class="out" alt="output picture" src="data:{mime};base64,{b64}"{width}>'
        if "image/svg+xml" in data: return f'<div class="out svg">{data["image/svg+xml"]}</div>'
        if "text/html" in data: return f'<div class="out html">{self.rewrite(data["text/html"], ch)}</div>'
        if "text/markdown" in data: return f'<div class="out md">{self.markdown(data["text/markdown"], ch)}</div>'
        if "text/plain" in data and WIDGET_VIEW not in data:
            return f'<pre class="out">{ansi2html(data["text/plain"])}</pre>'
        return ""

    def cell(self, c, ch:Chapter)->str:
        "One cell as HTML ('' when the book leaves it out)."
        if c.cell_type == "markdown":
            return f'<div class="md">{self.markdown(c.source, ch, c.get("attachments"))}</div>'
        if c.cell_type != "code": return ""
        d, code = directives(c.source)
        if "hide" in d or d.get("include") == "false": return ""
        outs = "" if d.get("output") == "false" else "".join(self.output(o, ch) for o in c.get("outputs", []))
        if FOLD & d.keys() and code:
            rows = export_summary(code)
            sig = "".join(f'<span class="sig"{f" id={n!r}" if n and self._claim(n, ch) else ""}><code>{html.escape(s)}'
                          f'</code>{f"<span class=doc>{html.escape(doc)}</span>" if doc else ""}</span>'
                          for s, doc, n in rows)
            body = f'<details class="export"><summary>{sig}</summary>{code_html(code)}</details>'
        else: body = "" if d.get("echo") == "false" or not code else f'<div class="input">{code_html(code)}</div>'
        if not body and not outs: return ""
        return f'<div class="cell">{body}{f"<div class=outputs>{outs}</div>" if outs else ""}</div>'

    def _claim(self, name:str, ch:Chapter)->bool:
        if name in ch.ids: return False
        ch.ids.add(name); return True

    # ---- pages
    def page(self, title:str, body:str, current:str, toc:list, pager:str="")->str:
        side = "".join(f'<li{" class=current" if c.page == current else ""}>'
                       f'<a href="{c.page}">{html.escape(c.title)}</a></li>' for c in self.chs)
        toc_html = "".join(f'<li class="l{lv}"><a href="#{i}">{t}</a></li>' for lv, i, t in toc)
        return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
                f'<meta name="viewport" content="width=device-width, initial-scale=1">'
                f'<title>{html.escape(title)} · {html.escape(self.title)}</title><link rel="icon" href="data:,">'
                f'<link rel="stylesheet" href="book.css"></head>\n<body>'
                f'<nav class="chapters" aria-label="chapters">'
                f'<a class="book" href="index.html">{html.escape(self.title)}</a>'
                f'<ol>{side}</ol></nav>\n<main><article>{body}</article>{pager}</main>\n'
                f'<aside class="toc" aria-label="on this page">'
                f'{"<div>On this page</div><ul>" + toc_html + "</ul>" if toc else ""}'
                f'</aside></body></html>\n')

    def front(self)->str:
        "The front page when there is no `index.ipynb`: the chapters, each with its description."
        ch = Chapter(self.nbs/"index.ipynb", "index.html", "Contents")
        return self.page("Contents", f"<h1>{html.escape(self.title)}</h1>" + self.contents(ch), "index.html", ch.toc)

    def chapter(self, k:int)->str:
        ch = self.chs[k]
        body = "".join(self.cell(c, ch) for c in ch.nb.cells)
        if ch.page == "index.html": body += self.contents(ch)
        prev = (f'<a class="prev" href="{self.chs[k-1].page}">← {html.escape(self.chs[k-1].title)}</a>' if k
                else "<span></span>")
        nxt = (f'<a class="next" href="{self.chs[k+1].page}">{html.escape(self.chs[k+1].title)} →</a>'
               if k + 1 < len(self.chs) else "")
        return self.page(ch.title, body, ch.page, ch.toc, f'<nav class="pager">{prev}{nxt}</nav>')

    def contents(self, ch:Chapter)->str:
        "The chapters listed on the front page, each with its one-line description (its links made from the front page)."
        i = slug("Chapters", ch.ids); ch.toc.append((2, i, "Chapters"))
        items = "".join(f'<li><a href="{c.page}">{html.escape(c.title)}</a>'
                        f'{f"<div class=desc>{self.markdown(c.description, ch)}</div>" if c.description else ""}</li>'
                        for c in self.chs if c.page != "index.html")
        return f'<div class="md"><h2 id="{i}">Chapters</h2><ol class="contents">{items}</ol></div>'

    def source(self, page:str, path:Path)->str:
        rel = path.relative_to(self.root).as_posix()
        try: lexer = get_lexer_for_filename(path.name)
        except ClassNotFound: lexer = TextLexer()
        return self.page(rel, f"<h1>{html.escape(rel)}</h1>{code_html(path.read_text(), lexer)}", page, [])

    def build(self)->list[Path]:
        "Write every page and the stylesheet; returns the pages written."
        self.out.mkdir(parents=True, exist_ok=True)
        for old in self.out.glob("*.html"): old.unlink()
        written = []
        if "index" not in self.by_stem: (p := self.out/"index.html").write_text(self.front()); written.append(p)
        for k, ch in enumerate(self.chs):
            (p := self.out/ch.page).write_text(self.chapter(k)); written.append(p)
        for page, path in sorted(self.sources.items()):
            (p := self.out/page).write_text(self.source(page, path)); written.append(p)
        (self.out/"book.css").write_text(CSS + HtmlFormatter(style="default").get_style_defs(".highlight"))
        if self.strict and self.problems: raise ValueError(f"{len(self.problems)} problem(s): {self.problems}")
        return written

def build(nbs:Path=ROOT/"nbs", out:Path=ROOT/"_book", strict:bool=False)->list[Path]:
    "Render the book; returns the pages written (the front page first)."
    return Book(nbs, out, strict).build()

CSS = """
:root { --fg:#1f2328; --muted:#59636e; --line:#d1d9e0; --bg2:#f6f8fa; --accent:#0969da; }
* { box-sizing: border-box; }
html { scroll-padding-top: 1rem; }
body { margin:0; color:var(--fg); font:16px/1.6 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", sans-serif;
       display:grid; grid-template-columns: 16rem minmax(0, 1fr) 14rem; }
nav.chapters, aside.toc { position:sticky; top:0; height:100vh; overflow-y:auto; padding:1rem; font-size:.88rem; }
nav.chapters { border-right:1px solid var(--line); background:var(--bg2); }
nav.chapters .book { display:block; font-weight:700; font-size:1.05rem; margin-bottom:.6rem; color:var(--fg); }
nav.chapters ol { list-style:none; padding:0; margin:0; }
nav.chapters li a { display:block; padding:.25rem .5rem; border-radius:6px; color:var(--fg); }
nav.chapters li.current a { background:#ddf4ff; font-weight:600; }
aside.toc div { font-weight:600; margin-bottom:.4rem; }
aside.toc ul { list-style:none; padding:0; margin:0; }
aside.toc li { padding:.15rem 0; } aside.toc li.l3 { padding-left:.9rem; } aside.toc li.l4 { padding-left:1.8rem; }
a { color:var(--accent); text-decoration:none; } a:hover { text-decoration:underline; }
main { padding:1.5rem 2.5rem 4rem; min-width:0; }
article { max-width:54rem; margin:0 auto; }
h1 { font-size:2rem; margin:.5rem 0 .6rem; line-height:1.25; }
h2 { margin-top:2.2rem; padding-bottom:.3rem; border-bottom:1px solid var(--line); }
h1 .anchor, h2 .anchor, h3 .anchor, h4 .anchor { margin-left:.4rem; color:var(--line); visibility:hidden; }
h1:hover .anchor, h2:hover .anchor, h3:hover .anchor, h4:hover .anchor { visibility:visible; }
h1 + blockquote { border:0; padding:0; margin:0 0 1.5rem; color:var(--muted); font-size:1.12rem; }
blockquote { margin:1rem 0; padding:0 1rem; border-left:4px solid var(--line); color:var(--muted); }
code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size:.88em; }
:not(pre) > code { background:var(--bg2); padding:.1em .3em; border-radius:4px; }
pre { margin:0; white-space:pre; overflow-x:auto; font-size:.84rem; line-height:1.45;
      font-family: ui-monospace, "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.highlight { background:var(--bg2); border-radius:6px; margin:.6rem 0; }
.highlight pre { padding:.7rem .9rem; }
.md table, .out table { border-collapse:collapse; margin:.6rem 0; font-size:.86rem; display:block; overflow-x:auto;
                       max-width:100%; }
.md th, .md td, .out th, .out td { border:1px solid var(--line); padding:.25rem .6rem; text-align:left;
                                   vertical-align:top; }
.md th, .out th { background:var(--bg2); }
.cell { margin:.8rem 0; }
.input .highlight { border-left:3px solid #bcd; }
.outputs { margin:.2rem 0 0; padding-left:.2rem; }
pre.out { padding:.5rem .8rem; border-left:3px solid var(--line); max-height:28rem; overflow:auto; }
pre.out.stderr { background:#fff8e6; border-left-color:#d4a72c; }
pre.out.error { background:#ffebe9; border-left-color:#cf222e; }
img { max-width:100%; height:auto; } img.out { display:block; margin:.4rem 0; }
div.out.html, div.out.md { overflow-x:auto; margin:.3rem 0; }
details.export { border:1px solid var(--line); border-radius:8px; margin:.8rem 0; background:#fff; }
details.export > summary { cursor:pointer; padding:.5rem 6.5rem .5rem .8rem; list-style:none; position:relative; }
details.export > summary::-webkit-details-marker { display:none; }
details.export > summary::after { content:"show code ▸"; position:absolute; right:.8rem; top:.55rem; font-size:.8rem;
                                  color:var(--accent); }
details.export[open] > summary::after { content:"hide code ▾"; }
details.export[open] > summary { border-bottom:1px solid var(--line); }
details.export .highlight { margin:0; border-radius:0 0 8px 8px; }
.sig { display:block; padding:.1rem 0; } .sig code { font-weight:600; color:#0550ae; background:none; padding:0; }
.sig .doc { display:block; color:var(--muted); font-size:.92rem; }
a.ref code { color:var(--accent); }
ol.contents li { margin:.4rem 0; } ol.contents .desc { color:var(--muted); font-size:.92rem; } .desc p { margin:0; }
nav.pager { max-width:54rem; margin:3rem auto 0; display:flex; justify-content:space-between; gap:1rem;
            border-top:1px solid var(--line); padding-top:1rem; }
/* the page's own headings only where a 100-character code line still fits beside them (54rem of article) */
@media (max-width: 1440px) { body { grid-template-columns: 15rem minmax(0, 1fr); } aside.toc { display:none; } }
@media (max-width: 760px) { body { display:block; } nav.chapters { position:static; height:auto; }
                            main { padding:1rem; } }
"""

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="_book", help="folder to write the book into (default: _book)")
    ap.add_argument("--nbs", default=str(ROOT/"nbs"), help="folder of the notebooks (default: the repository's nbs/)")
    ap.add_argument("--strict", action="store_true", help="fail on a broken link or a missing picture")
    a = ap.parse_args()
    pages = build(Path(a.nbs), Path(a.out), a.strict)
    print(f"book: {len(pages)} pages -> {Path(a.out)/'index.html'}")

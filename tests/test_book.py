"""The static book (`make book`, tools/book.py): a small notebook pair rendered and read back (export cells folded
under their signatures, hidden cells gone, pictures embedded, links rewritten), and the real book opened in headless
Chromium: every page loads without console errors, every picture shows, every internal link and anchor resolves, and
at 1280 px no code block of a chapter runs off the page (its lines are <= 100 characters, which fit)."""
import base64, json, os, re, struct, sys, time, zlib
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"tools"))
import book                                        # noqa: E402  (tools/ is not a package)

CHROMIUM = "/usr/lib/chromium/chromium"            # Debian's binary (/usr/bin/chromium is a wrapper script)
SHOTS = ROOT/"tests"/"book_screenshots"            # gitignored: look at them after a run

def _png(w:int, h:int)->str:
    "A w×h grey PNG, base64 (written by hand so the test needs no image library)."
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
    raw = b"".join(b"\x00" + b"\x80" * w for _ in range(h))
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 0, 0, 0, 0))
           + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    return base64.b64encode(png).decode()

def _nb(cells:list)->str:
    mk = lambda i, c: ({"cell_type": "markdown", "id": f"c{i}", "metadata": {}, "source": c} if isinstance(c, str) else
                       {"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None, "source": c[0],
                        "outputs": c[1]})
    return json.dumps({"cells": [mk(i, c) for i, c in enumerate(cells)], "metadata": {}, "nbformat": 4,
                       "nbformat_minor": 5})

PIC = _png(7, 5)
FIRST = [
    "# First chapter\n\n> What the first chapter is for.",
    ("#| default_exp first", []),
    ("#| export\nimport os", []),
    ("#| export\ndef save_thing(model, path, *, mode:int=0o755, **kw):\n"
     "    \"\"\"Save a thing somewhere.\n\n    More.\"\"\"\n    secret_body_marker = 1\n    return path", []),
    ("#| hide\nhidden_cell_marker = 2", [{"output_type": "stream", "name": "stdout", "text": "hidden output\n"}]),
    "## Results\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nSee [the second](02_second.ipynb#more-detail) and `save_thing`."
    "\n\n![the plan](../images/plan.png) and [a script](../examples/run.py)",
    ("shown_cell_marker = 3", [{"output_type": "display_data", "metadata": {}, "data": {"image/png": PIC,
                                                                                       "text/plain": "<Figure>"}}]),
]
SECOND = ["# Second chapter", "## More detail\n\nUses `save_thing` from [the first](01_first.ipynb), as "
          "`first.save_thing()`; `path.save_thing` is not it.",
          ("#| echo: false\necho_false_marker = 4", [{"output_type": "stream", "name": "stdout", "text": "echoed\n"}])]

CODE_WIDTH = 100                                   # characters a code line of a chapter may take: fits at 1280 px
CHAPTERS = sorted(p for p in (ROOT/"nbs").glob("[0-9]*.ipynb") if not p.name.startswith("95"))   # 95: fixtures
FENCE = re.compile(r"^ {0,3}```[^\n]*\n(.*?)^ {0,3}```", re.M | re.S)

def too_wide(path:Path, width:int=CODE_WIDTH)->list[tuple[int, str]]:
    """(cell, line) of every code line the book shows open that is wider than `width`: code cells it shows (not
    hidden, not `echo: false`, not folded export cells: library code, <= 120) and code blocks in the prose."""
    out = []
    for i, c in enumerate(json.loads(path.read_text())["cells"]):
        src = "".join(c["source"])
        if c["cell_type"] == "markdown": lines = [l for b in FENCE.findall(src) for l in b.splitlines()]
        elif c["cell_type"] == "code":
            d, code = book.directives(src)
            if "hide" in d or d.get("include") == "false" or d.get("echo") == "false" or book.FOLD & d.keys():
                continue
            lines = code.splitlines()
        else: continue
        out += [(i, l) for l in lines if len(l) > width]
    return out

# Chapters whose shown code is not wrapped yet (issue 50): each is checked to
# still have a wide line (test_wide_pending_still_fails), so a fixed chapter must leave this set: empty it, never grow.
WIDE_PENDING: set[str] = set()

@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_code_fits_the_page(path):
    if path.name in WIDE_PENDING: pytest.skip(f"{path.name} is PENDING (WIDE_PENDING)")
    wide = too_wide(path)
    assert not wide, (f"{path.name}: {len(wide)} code lines over {CODE_WIDTH} characters (they run off the page at "
                      f"1280 px): " + "; ".join(f"cell {i}: {l[:60]}…({len(l)})" for i, l in wide[:5]))

@pytest.mark.parametrize("name", sorted(WIDE_PENDING))
def test_wide_pending_still_fails(name):
    assert too_wide(ROOT/"nbs"/name), f"{name} fits now: remove it from WIDE_PENDING"

def test_too_wide_can_fail(tmp_path):
    long = "x = " + "1 + " * 30 + "1"
    p = tmp_path/"01_a.ipynb"
    p.write_text(_nb(["# A\n\n```python\n" + long + "\n```", (long, []), ("#| hide\n" + long, []),
                      ("#| export\n" + long, []), ("#| echo: false\n" + long, [])]))
    assert [i for i, _ in too_wide(p)] == [0, 1]

def test_book_renders_a_chapter_pair(tmp_path):
    nbs, out = tmp_path/"nbs", tmp_path/"book"
    nbs.mkdir()
    (nbs/"02_second.ipynb").write_text(_nb(SECOND)); (nbs/"01_first.ipynb").write_text(_nb(FIRST))
    (tmp_path/"images").mkdir(); (tmp_path/"images"/"plan.png").write_bytes(base64.b64decode(_png(3, 2)))
    (tmp_path/"examples").mkdir(); (tmp_path/"examples"/"run.py").write_text("print('run')\n")
    pages = book.build(nbs, out, strict=True)
    assert [p.name for p in pages] == ["index.html", "01_first.html", "02_second.html", "src.examples.run.py.html"]
    first = BeautifulSoup((out/"01_first.html").read_text(), "html.parser")
    assert first.title.text.startswith("First chapter")
    assert [a["href"] for a in first.select("nav.chapters li a")] == ["01_first.html", "02_second.html"]
    index = BeautifulSoup((out/"index.html").read_text(), "html.parser")
    assert [a["href"] for a in index.select("ol.contents a")] == ["01_first.html", "02_second.html"]
    assert index.select_one("ol.contents .desc").text.strip() == "What the first chapter is for."
    folds = first.select("details.export")
    assert len(folds) == 2                                                       # both export cells, folded
    sig = folds[1].summary
    assert sig.select_one("code").text == "def save_thing(model, path, *, mode=0o755, **kw)"
    assert sig.select_one(".doc").text == "Save a thing somewhere."
    assert "secret_body_marker" not in sig.text and "secret_body_marker" in folds[1].text   # the code is inside
    assert folds[0].summary.text.startswith("imports os")
    text = first.text
    assert "hidden_cell_marker" not in text and "hidden output" not in text and "default_exp" not in text
    assert "shown_cell_marker" in text
    img = first.select_one("img.out")
    assert img["src"] == f"data:image/png;base64,{PIC}"
    assert [td.text for td in first.select(".md table td")] == ["1", "2"]
    assert first.select_one('img[alt="the plan"]')["src"] == f"data:image/png;base64,{_png(3, 2)}"
    assert first.select_one('a[href="src.examples.run.py.html"]')                 # a repository file: its own page
    assert "print" in BeautifulSoup((out/"src.examples.run.py.html").read_text(), "html.parser").select_one("pre").text
    assert first.select_one('a[href="02_second.html#more-detail"]')
    assert [a["href"] for a in first.select("aside.toc a")] == ["#results"]
    assert first.select_one("h1 + blockquote").text.strip() == "What the first chapter is for."
    second = BeautifulSoup((out/"02_second.html").read_text(), "html.parser")
    assert second.select_one("h2#more-detail")
    refs = [a.text for a in second.select('a.ref[href="01_first.html#save_thing"]')]
    assert refs == ["save_thing", "first.save_thing()"]                          # code spans link their definition
    assert first.select_one("#save_thing") and second.select_one('a[href="01_first.html"]')
    assert "echo_false_marker" not in second.text and "echoed" in second.text

def test_book_reports_broken_links(tmp_path):
    nbs = tmp_path/"nbs"; nbs.mkdir()
    (nbs/"01_a.ipynb").write_text(_nb(["# A\n\n[gone](99_missing.ipynb) ![](no_such.png)"]))
    with pytest.raises(ValueError, match="99_missing.ipynb"): book.build(nbs, tmp_path/"b", strict=True)
    with pytest.raises(FileNotFoundError): book.build(tmp_path/"empty", tmp_path/"b")

def _missing()->str|None:
    if not os.access(CHROMIUM, os.X_OK): return f"no Chromium at {CHROMIUM} (make browser-deps installs it)"
    try: import playwright  # noqa: F401
    except ImportError: return "python package playwright is not installed (make browser-deps installs it)"
    return None

def _need_browser():
    "Skip when Chromium or Playwright is missing; under CI a missing browser fails the test instead."
    why = _missing()
    if why:
        if os.environ.get("CI") == "true": pytest.fail(f"browser test must run under CI=true: {why}")
        pytest.skip(f"browser test skipped: {why}")

@pytest.fixture(scope="module")
def real_book(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    pages = book.build(ROOT/"nbs", out, strict=True)          # a broken link or a missing picture fails here
    return out, pages

def test_real_book_folds_every_export_cell(real_book):
    out, pages = real_book
    nbs = sorted((ROOT/"nbs").glob("*.ipynb"), key=lambda p: (p.stem != "index", p.name))
    assert [p.name for p in pages[:len(nbs)]] == ["index.html" if p.stem == "index" else f"{p.stem}.html" for p in nbs]
    for nb, page in zip(nbs, pages):
        shown = [(d, c) for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"
                 for d, code in [book.directives("".join(c["source"]))] if code and "hide" not in d]
        text = page.read_text()
        assert text.count('<details class="export">') == sum(bool(book.FOLD & d.keys()) for d, _ in shown), page.name
        pngs = sum("image/png" in o.get("data", {}) for _, c in shown for o in c["outputs"])
        assert text.count('src="data:image/png;base64,') >= pngs, page.name

def test_book_in_chromium(real_book):
    _need_browser()
    from playwright.sync_api import sync_playwright
    out, pages = real_book
    SHOTS.mkdir(parents=True, exist_ok=True)
    for old in SHOTS.glob("*.png"):                 # this test's shots of an earlier run (not test_code_fits_at_1280's)
        if "_1280" not in old.stem: old.unlink()
    errors, seen, links = [], {}, []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            where = {"page": ""}
            page.on("console", lambda m: m.type == "error" and errors.append(f"{where['page']}: {m.text}"))
            page.on("pageerror", lambda e: errors.append(f"{where['page']}: {e}"))
            page.on("requestfailed", lambda r: errors.append(f"{where['page']}: failed {r.url[:120]}"))
            for p in pages:
                where["page"] = p.name
                page.goto(p.as_uri(), wait_until="load")
                imgs = page.evaluate("Array.from(document.images)"
                                     ".map(i => [i.complete, i.naturalWidth, i.src.slice(0, 80)])")
                bad = [s for ok, w, s in imgs if not ok or w == 0]
                assert not bad, f"{p.name}: pictures that did not load: {bad}"
                seen[p.name] = set(page.evaluate("Array.from(document.querySelectorAll('[id]')).map(e => e.id)"))
                hrefs = page.evaluate("Array.from(document.querySelectorAll('a[href]'))"
                                      ".map(a => a.getAttribute('href'))")
                links += [(p.name, h) for h in hrefs]
                assert page.evaluate("getComputedStyle(document.querySelector('article')).maxWidth") != "none"
            broken = []
            for src, href in links:
                parts = urlsplit(href)
                if parts.scheme in ("http", "https", "mailto"): continue
                assert not parts.scheme, f"{src}: link {href!r} leaves the book"
                target = unquote(parts.path) or src
                if not (out/target).is_file(): broken.append(f"{src}: {href} (no page {target})")
                elif parts.fragment and unquote(parts.fragment) not in seen.get(target, set()):
                    broken.append(f"{src}: {href} (no #{parts.fragment} on {target})")
            assert not broken, f"{len(broken)} broken links: {broken[:20]}"
            assert len(links) > len(pages), "hardly any links: the sidebar is missing"
            # follow one cross-chapter link by clicking it, as a reader does, and land on its anchor
            where["page"] = "index.html"
            page.goto((out/"index.html").as_uri())
            page.screenshot(path=str(SHOTS/"index.png"))
            ref = next((h for s, h in links if "#" in h and not h.startswith("#") and h.split("#")[0] != s), None)
            if ref:
                src = next(s for s, h in links if h == ref)
                page.goto((out/src).as_uri())
                page.click(f'a[href="{ref}"] >> nth=0')
                page.wait_for_load_state("load")
                assert page.url.endswith(ref), (page.url, ref)
            shot = next((p for p in pages if p.name.startswith("05_")), pages[-1])
            page.goto(shot.as_uri())
            page.screenshot(path=str(SHOTS/f"{shot.stem}.png"))
            fold = page.locator("details.export").first
            if fold.count():
                fold.locator("summary").click()
                assert fold.evaluate("d => d.open") and fold.locator(".highlight").is_visible()
                fold.scroll_into_view_if_needed(); page.screenshot(path=str(SHOTS/f"{shot.stem}_open.png"))
        finally:
            browser.close()
    assert not errors, f"console errors: {errors[:20]}"

GLANCE = ("13_rollout", "08_tour")                  # chapters photographed at 1280 px (issue 50)

def test_code_fits_at_1280(real_book):
    "At 1280 px every code block the chapters show open fits its box: nothing runs off the page (WIDE_PENDING aside)."
    _need_browser()
    from playwright.sync_api import sync_playwright
    out, pages = real_book
    SHOTS.mkdir(parents=True, exist_ok=True)
    chapters = [out/f"{p.stem}.html" for p in CHAPTERS if p.name not in WIDE_PENDING]
    off, widths = [], {}
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--no-first-run"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            for p in chapters:
                page.goto(p.as_uri(), wait_until="load")
                # the code boxes a reader sees without a click (folded export cells have no box)
                boxes = page.evaluate("""() => Array.from(document.querySelectorAll('article .highlight pre'))
                    .filter(e => e.offsetParent !== null && !e.closest('details:not([open])'))
                    .map((e, i) => { e.dataset.box = i; return [i, e.scrollWidth, e.clientWidth,
                                     Math.max(...e.textContent.split('\\n').map(l => l.length))]; })""")
                off += [f"{p.stem}: box {i} is {sw} px wide in {cw} px ({n} characters)"
                        for i, sw, cw, n in boxes if sw > cw]
                widths[p.stem] = max((n for *_, n in boxes), default=0)
                if p.stem in GLANCE:
                    page.screenshot(path=str(SHOTS/f"{p.stem}_1280.png"), full_page=True)
                    if boxes:                   # the box with the widest line, as the reader sees it
                        i = max(boxes, key=lambda b: b[3])[0]
                        page.locator(f'[data-box="{i}"]').scroll_into_view_if_needed()
                        page.screenshot(path=str(SHOTS/f"{p.stem}_1280_widest.png"))
        finally:
            browser.close()
    assert len(widths) == len(chapters) and max(widths.values()) <= CODE_WIDTH, widths
    assert not off, f"{len(off)} code blocks run off the page at 1280 px: {off[:10]}"

CORE_FONTS = Path("/usr/share/fonts/truetype/dejavu")   # Debian's fonts-dejavu-core, which `make chromium` installs

def test_every_glyph_has_a_font():
    "Every character of the notebooks (sources, outputs), the README and the library is in the installed fonts."
    files = [CORE_FONTS/f"{n}.ttf" for n in ("DejaVuSans", "DejaVuSans-Bold", "DejaVuSansMono", "DejaVuSansMono-Bold")]
    if not all(f.exists() for f in files):
        if os.environ.get("CI") == "true": pytest.fail(f"fonts-dejavu-core is not installed: {CORE_FONTS}")
        pytest.skip(f"fonts-dejavu-core is not installed ({CORE_FONTS})")
    from matplotlib import ft2font
    cover = set().union(*(ft2font.FT2Font(str(f)).get_charmap() for f in files))
    missing = {}
    texts = [(p.name, p.read_text()) for p in [*(ROOT/"lora_fsdp_kit").glob("*.py"), ROOT/"README.md"]]
    texts += [(p.name, p.read_text()) for p in (ROOT/"nbs").glob("*.ipynb")]   # JSON keeps non-ASCII as it is
    for name, text in texts:
        for ch in set(text):
            if ord(ch) > 127 and ord(ch) not in cover and ch not in "\ufe0f\u200b": missing.setdefault(ch, name)
    assert not missing, f"characters no installed font draws (an empty box in the book): {missing}"

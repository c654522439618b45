"""The plan explorer works in a real browser: Voilà serves a notebook showing `explore(model)` on the tiny Qwen3-Omni,
headless Chromium (Debian's, driven by Playwright) turns the knobs, and every step changes what the user sees."""
import hashlib, os, re, shutil, signal, subprocess, sys, time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/lib/chromium/chromium"          # Debian's binary (/usr/bin/chromium is a wrapper script)
SHOTS = ROOT/"tests"/"browser_screenshots"       # gitignored: look at them after a run
NOTEBOOK = """{"cells": [
 {"cell_type": "code", "metadata": {}, "execution_count": null, "outputs": [], "source":
  "from lora_fsdp_kit.plan import tiny_lora_model\\nfrom lora_fsdp_kit.viz import explore\\nmodel = tiny_lora_model('qwen3_omni', modules='thinker')"},
 {"cell_type": "code", "metadata": {}, "execution_count": null, "outputs": [], "source": "explore(model)"}],
 "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
 "nbformat": 4, "nbformat_minor": 5}"""

def _missing()->str|None:
    "Why the browser test cannot run here (None: it can)."
    if not os.access(CHROMIUM, os.X_OK): return f"no Chromium at {CHROMIUM} (make browser-deps installs it)"
    for mod in ("playwright", "voila"):
        try: __import__(mod)
        except ImportError: return f"python package {mod} is not installed (make browser-deps installs it)"
    return None

def _serve(notebook:Path, d:Path):
    "Voilà serving `notebook` (log in `d`); yields its URL, and stops it with its kernel afterwards."
    why = _missing()
    if why:
        if os.environ.get("CI") == "true": pytest.fail(f"browser test must run under CI=true: {why}")
        pytest.skip(f"browser test skipped: {why}")
    log = open(d/"voila.log", "w+")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-m", "voila", str(notebook), "--no-browser", "--port=8866",
                             "--Voila.ip=127.0.0.1", "--show_tracebacks=True"], cwd=notebook.parent, env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        url, t0 = None, time.monotonic()
        while url is None and time.monotonic() - t0 < 90:     # Voilà takes the next port when one is busy
            time.sleep(0.3)
            log.seek(0); m = re.search(r"(http://127\.0\.0\.1:\d+/)", log.read())
            if m: url = m.group(1)
            assert proc.poll() is None, f"voila exited: {(d/'voila.log').read_text()[-2000:]}"
        assert url, f"voila did not start within 90 s: {(d/'voila.log').read_text()[-2000:]}"
        yield url
    finally:
        # Voilà 0.5 on tornado 6.6 ignores SIGTERM: SIGINT, then the whole process group (its kernel included)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try: proc.wait(10)
            except subprocess.TimeoutExpired: pass
        try: os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError: pass
        proc.wait(10); log.close()

@pytest.fixture(scope="module")
def voila_url(tmp_path_factory):
    d = tmp_path_factory.mktemp("voila")
    (d/"explore.ipynb").write_text(NOTEBOOK)
    yield from _serve(d/"explore.ipynb", d)

@pytest.fixture(scope="module")
def viz_url(tmp_path_factory):
    yield from _serve(ROOT/"nbs"/"04_viz.ipynb", tmp_path_factory.mktemp("voila_viz"))

class Panel:
    "The explorer as the browser shows it: read the summary and the chart, wait for them to change."
    def __init__(self, page): self.page = page
    def summary(self)->str: return self.page.inner_text(".lfk-status")
    def chart(self)->str|None:
        "A digest of the chart's PNG bytes as the browser holds them (None: no chart shown)."
        return self.page.evaluate("""async () => {
            const img = document.querySelector('img.lfk-chart');
            if (!img || !img.isConnected || img.offsetParent === null) return null;
            const buf = await (await fetch(img.src)).arrayBuffer();
            const d = await crypto.subtle.digest('SHA-256', buf);
            return Array.from(new Uint8Array(d)).map(b => b.toString(16).padStart(2, '0')).join('');}""")
    def step(self, name:str, act, expect:str|None=None, chart:bool|None=True, timeout:float=30.0):
        "Do `act`; wait until the summary changed (and shows `expect`) and the chart changed (chart=None: may stay)."
        s0, c0 = self.summary(), self.chart()
        act()
        t0 = time.monotonic()
        def done(s, c):
            return (s != s0 and (expect is None or expect in s)
                    and (chart is None or (c != c0 and (c is not None) == chart)))
        while time.monotonic() - t0 < timeout:
            s, c = self.summary(), self.chart()
            if done(s, c): break
            time.sleep(0.25)
        self.page.screenshot(path=str(SHOTS/f"{name}.png"), full_page=True)
        assert s != s0, f"{name}: the summary did not change: {s!r}"
        assert expect is None or expect in s, f"{name}: the summary lacks {expect!r}: {s!r}"
        if chart is not None:
            assert c != c0, f"{name}: the chart did not change"
            assert (c is not None) == chart, f"{name}: chart shown={c is not None}, expected {chart}"
        self.check_page(name)
        return s
    def check_page(self, name:str):
        text = self.page.inner_text("body")
        assert "VBox(" not in text, f"{name}: the widget shows as raw text"
        assert "Traceback" not in text and "Error displaying widget" not in text, f"{name}: {text[-1500:]}"

def _chromium(pw):
    return pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
        "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"])

def test_explorer_in_chromium(voila_url):
    from playwright.sync_api import sync_playwright
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(voila_url, timeout=120_000)
            page.wait_for_selector("img.lfk-chart", timeout=120_000)   # the kernel ran the notebook
            p = Panel(page)
            for _ in range(40):                                        # the chart is drawn shortly after the text
                if p.chart(): break
                time.sleep(0.25)
            assert p.summary().startswith("FSDP1 plan of"), p.summary()
            assert p.chart(), "no chart at start"
            page.screenshot(path=str(SHOTS/"0_start.png"), full_page=True); p.check_page("start")

            flavour = lambda v: (lambda: page.click(f".lfk-flavour button:has-text('{v}')"))
            p.step("1_fsdp2", flavour("fsdp2"), "FSDP2 plan")
            assert page.is_disabled(".lfk-size input") and page.is_disabled(".lfk-uop input")
            p.step("2_fsdp1", flavour("fsdp1"), "FSDP1 plan")
            assert page.query_selector(".lfk-slider [disabled]"), "the slider is enabled with the size part off"
            p.step("2b_uop", lambda: page.click(".lfk-uop input"), "use_orig_params=True", chart=None)   # every knob
            p.step("2c_uop_off", lambda: page.click(".lfk-uop input"), "use_orig_params=False", chart=None)
            p.step("3_size_part", lambda: page.click(".lfk-size input"), "min_num_params=")
            assert not page.is_checked(".lfk-leaves input") and page.is_disabled(".lfk-leaves input")
            before = re.search(r"min_num_params=([\d,]+)", p.summary()).group(1)
            def slide():                                   # one step left on the log scale, as a user's key press
                page.focus(".lfk-slider .noUi-handle"); page.keyboard.press("ArrowLeft")
            s = p.step("4_slider", slide, "min_num_params=")
            after = re.search(r"min_num_params=([\d,]+)", s).group(1)
            shown = page.inner_text(".lfk-slider .widget-readout").strip()
            assert after != before and shown == after, (before, after, shown)   # the value shown is the value used

            page.click(".lfk-tabs .lm-TabBar-tab:has-text('tree')")
            page.wait_for_selector(".lfk-tree table", state="visible", timeout=10_000)
            assert "base_model" in page.inner_text(".lfk-tree")
            page.screenshot(path=str(SHOTS/"5_tree.png"), full_page=True)
            page.click(".lfk-tabs .lm-TabBar-tab:has-text('findings')")
            page.wait_for_selector(".lfk-findings details", state="visible", timeout=10_000)   # one per kind
            assert "mixed-requires-grad" in page.inner_text(".lfk-findings")
            page.screenshot(path=str(SHOTS/"6_findings.png"), full_page=True)
            page.click(".lfk-tabs .lm-TabBar-tab:has-text('chart')")

            p.step("7_size_off", lambda: page.click(".lfk-size input"), "FSDP1 plan")
            p.step("8_no_leaves", lambda: page.click(".lfk-leaves input"), "FSDP1 plan")
            p.step("9_cannot_plan", lambda: page.select_option(".lfk-classes select", []), "cannot plan", chart=False)
            assert "cannot plan" in page.inner_text(".lfk-chart-message")
            first = page.eval_on_selector(".lfk-classes select", "s => s.options[0].value")
            p.step("10_recovered", lambda: page.select_option(".lfk-classes select", [first]), "FSDP1 plan")
            p.check_page("end")
        finally:
            browser.close()
    assert not errors, f"JavaScript errors on the page: {errors}"

# A ceiling against a hang, not a speed check: a timed assert fails at random on a shared 2-core machine (CI once
# measured 16.2 s at load 2.7, against 10 s scaled by the load). How fast the first paint is (bound: 10 s on an idle
# machine) is measured by bench/first_paint.py, beside Voila serving a notebook that only imports the kit.
FIRST_PAINT_CEILING_S = float(os.environ.get("LFK_FIRST_PAINT_CEILING_S", "90"))

def first_paint(page, url:str)->float:
    "Seconds from opening `url` until the explorer's chart is shown (the ceiling fails the test)."
    t0 = time.monotonic()
    page.goto(url, timeout=FIRST_PAINT_CEILING_S * 1000)
    page.wait_for_selector("img.lfk-chart", state="visible", timeout=FIRST_PAINT_CEILING_S * 1000)
    p = Panel(page)
    while not p.chart() and time.monotonic() - t0 < FIRST_PAINT_CEILING_S: time.sleep(0.1)
    assert p.chart(), f"no chart within {FIRST_PAINT_CEILING_S:.0f} s of opening the page"
    return time.monotonic() - t0

def test_viz_notebook_first_paint_and_picker(viz_url):
    "04_viz in Voila: the panel is drawn (within the ceiling) and the model picker re-plans."
    from playwright.sync_api import sync_playwright
    SHOTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = _chromium(pw)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.on("pageerror", lambda e: errors.append(str(e)))
            t = first_paint(page, viz_url)
            print(f"04_viz first paint in Voila: {t:.1f} s (load {os.getloadavg()[0]:.1f})")
            page.screenshot(path=str(SHOTS/"viz_0_first_paint.png"))
            p = Panel(page)
            assert "LlamaForCausalLM" in p.summary(), p.summary()
            assert "Traceback" not in page.inner_text("body")
            p.step("viz_1_picker_omni", lambda: page.select_option(".lfk-picker select", "qwen3_omni"),
                   "Qwen3OmniMoeForConditionalGeneration")
            assert "model=qwen3_omni" in p.summary()
            page.set_viewport_size({"width": 1280, "height": 2400})    # the whole panel in view, then its picture
            page.wait_for_timeout(500)
            panel = page.query_selector(".lfk-picker").evaluate_handle("e => e.closest('.widget-vbox')").as_element()
            panel.screenshot(path=str(SHOTS/"viz_panel.png"))          # the picture the notebook shows
            page.set_viewport_size({"width": 1280, "height": 1000})
            status = page.eval_on_selector(".lfk-status", "e => [e.scrollWidth, e.clientWidth]")
            assert status[0] <= status[1] + 1, f"the status line runs off to the right: {status}"
            page.click(".lfk-tabs .lm-TabBar-tab:has-text('findings')")
            page.wait_for_selector(".lfk-findings details", state="visible", timeout=10_000)
            n_kinds = len(page.query_selector_all(".lfk-findings details"))
            assert 0 < n_kinds < 5, n_kinds                                  # grouped: one entry per kind
            page.click(".lfk-tabs .lm-TabBar-tab:has-text('tree')")
            page.wait_for_selector(".lfk-tree table", state="visible", timeout=10_000)
            box = page.eval_on_selector(".lfk-tree",
                                        "e => [e.scrollWidth, e.clientWidth, getComputedStyle(e).overflowX]")
            assert box[2] == "auto", box                                    # a wide tree scrolls inside its tab
            assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1"), "page overflows"
        finally:
            browser.close()
    assert not errors, f"JavaScript errors on the page: {errors}"

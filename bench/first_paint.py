"""How long a reader waits for the explorer app (`lfk explore`): until the URL is printed, then from opening it to
the chart on screen; beside Voilà's floor without a preheated kernel.

The app: `lfk explore` starts Voilà with a preheated kernel (the app notebook has run once when the URL is printed),
so the page only fetches what is drawn already. Each repeat is a fresh `lfk explore` (the test's server,
tests/test_browser.py), measured in headless Chromium: the seconds to ready (the command's start to its URL), and the
first paint (opening the URL to the chart on screen; the bound on an idle machine: 10 s).
The floor: Voilà without a preheated kernel on a notebook that imports the same module and shows one image widget
with the class the test waits for; every page starts a kernel and imports the kit (what each page cost before).

Run: .venv/bin/python bench/first_paint.py [--repeat 3]
"""
import argparse, contextlib, json, os, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"tests"))
import test_browser as tb                       # the test's server, browser and chart reader: one home

FLOOR = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source":
    "import base64, ipywidgets as w\nimport lora_fsdp_kit.explore.core, lora_fsdp_kit.plan.viz\n"
    "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==')\n"
    "w.Image(value=png, format='png', _dom_classes=('lfk-chart',))"}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5}

def paints(notebook:Path|None, repeat:int)->list[tuple[float, float]]:
    "(seconds to ready, first paint) per repeat: the app (`notebook` None) a fresh `lfk explore` each time."
    from playwright.sync_api import sync_playwright
    out = []
    with sync_playwright() as pw:
        browser = tb._chromium(pw)
        try:
            for _ in range(repeat if notebook is None else 1):
                with tempfile.TemporaryDirectory() as d, contextlib.closing(tb._serve(Path(d), notebook)) as served:
                    url, ready = next(served)
                    for _ in range(1 if notebook is None else repeat):   # the floor: a fresh kernel per page
                        page = browser.new_page(viewport={"width": 1280, "height": 1000})
                        out.append((ready, tb.first_paint(page, url))); page.close()
        finally: browser.close()
    return out

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if why := tb._missing(): sys.exit(f"first_paint: cannot run here: {why}")
    with tempfile.TemporaryDirectory() as d:
        floor_nb = Path(d)/"floor.ipynb"; floor_nb.write_text(json.dumps(FLOOR))
        load0 = os.getloadavg()[0]
        app = paints(None, args.repeat)
        floor = paints(floor_nb, args.repeat)
    r, v, f = (statistics.median(x[i] for x in xs) for xs, i in ((app, 0), (app, 1), (floor, 1)))
    print(f"the explorer app, median of {args.repeat} (load {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end)")
    print(f"  `lfk explore` start to its URL (ready): {r:5.1f} s   {' '.join(f'{x:.1f}' for x, _ in app)}")
    print(f"  first paint (URL opened to the chart):  {v:5.1f} s   {' '.join(f'{x:.1f}' for _, x in app)}   "
          f"bound 10 s on an idle machine: {'met' if v <= 10 else 'MISSED'}")
    print(f"  floor without a preheated kernel (import the kit, one image): {f:5.1f} s   "
          f"{' '.join(f'{x:.1f}' for _, x in floor)}")

"""How long a reader waits for the explorer app (`lfk explore`) in Voila, against Voila's own floor.

Serves the app as `lfk explore` does (`explore.app_command`), then a floor notebook that imports the same module and
shows one image widget with the class the test waits for, and opens each in headless Chromium (the browser test's
helpers, tests/test_browser.py). The floor is what any notebook that imports the kit costs (kernel start, imports,
the page); the difference is the kit's own work (building the model, planning, drawing). The bound, on an idle
machine: 10 s for the app.

Run: .venv/bin/python bench/first_paint.py [--repeat 3]
"""
import argparse, contextlib, json, os, statistics, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT/"tests"))
import test_browser as tb                       # the test's Voila server, browser and chart reader: one home

FLOOR = {"cells": [{"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [], "source":
    "import base64, ipywidgets as w\nimport lora_fsdp_kit.explore\n"
    "png = base64.b64decode('iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg==')\n"
    "w.Image(value=png, format='png', _dom_classes=('lfk-chart',))"}],
    "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"}},
    "nbformat": 4, "nbformat_minor": 5}

def paints(notebook:Path|None, repeat:int)->list[float]:
    "First-paint seconds of `notebook` (None: the app), one fresh page (and kernel) per repeat."
    from playwright.sync_api import sync_playwright
    out = []
    with tempfile.TemporaryDirectory() as d, contextlib.closing(tb._serve(Path(d), notebook)) as served:
        url = next(served)
        with sync_playwright() as pw:
            browser = tb._chromium(pw)
            try:
                for _ in range(repeat):
                    page = browser.new_page(viewport={"width": 1280, "height": 1000})
                    out.append(tb.first_paint(page, url)); page.close()
            finally: browser.close()
    return out

if __name__ == "__main__":
    ap = argparse.ArgumentParser(); ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if why := tb._missing(): sys.exit(f"first_paint: cannot run here: {why}")
    with tempfile.TemporaryDirectory() as d:
        floor_nb = Path(d)/"floor.ipynb"; floor_nb.write_text(json.dumps(FLOOR))
        load0 = os.getloadavg()[0]
        floor = paints(floor_nb, args.repeat)
        viz = paints(None, args.repeat)
    f, v = statistics.median(floor), statistics.median(viz)
    print(f"first paint in Voila, median of {args.repeat} (load {load0:.1f} at start, {os.getloadavg()[0]:.1f} at end)")
    print(f"  floor (import the kit, one image): {f:5.1f} s   {' '.join(f'{x:.1f}' for x in floor)}")
    print(f"  the explorer app (lfk explore):    {v:5.1f} s   {' '.join(f'{x:.1f}' for x in viz)}")
    print(f"  ratio {v / f:.2f}x the floor; the kit's own work {v - f:.1f} s; bound 10 s on an idle machine: "
          f"{'met' if v <= 10 else 'MISSED'}")

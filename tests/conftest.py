"""Longest files first: under `-n 2 --dist loadfile --no-loadscope-reorder` (see the Makefile) the workers take whole
files in this order, so no long file starts last while the other worker idles. Seconds of wall time per file, each run
alone on 2 cores (2026-12-01, the fork server's preload since trimmed for test_launch); a file not listed runs after
these, in collection order."""
COST = {"test_fits": 82, "test_browser": 72, "test_launch": 60, "test_cli": 60, "test_hazards": 44, "test_gather": 29,
        "test_device_check": 24, "test_plan_fidelity": 23, "test_script_guide": 21, "test_moe": 19, "test_book": 17,
        "test_gather_ranks": 16, "test_export": 15, "test_gather_sharded": 12, "test_measure": 11, "test_doctor": 11,
        "test_notebooks": 6, "test_prior_art": 2, "test_shards": 2, "test_readme": 2}

def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -COST.get(item.path.stem, 0))   # stable: a file's tests keep their order

"""Longest files first: under `-n 2 --dist loadfile --no-loadscope-reorder` (see the Makefile) the workers take whole
files in this order, so no long file starts last while the other worker idles. Seconds of wall time per file under
`-n 2`, measured on 2 cores (2026-12-01); a file not listed runs after these, in collection order."""
COST = {"test_launch": 105, "test_fits": 100, "test_export": 79, "test_cli": 79, "test_hazards": 72,
        "test_gather_ranks": 71, "test_gather": 70, "test_browser": 68, "test_measure": 59, "test_shards": 57,
        "test_moe": 37, "test_plan_fidelity": 33, "test_script_guide": 32, "test_device_check": 22, "test_book": 14,
        "test_doctor": 14, "test_prior_art": 14, "test_gather_sharded": 11, "test_notebooks": 8, "test_readme": 4}

def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -COST.get(item.path.stem, 0))   # stable: a file's tests keep their order

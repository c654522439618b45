"""Longest files first: under `-n 2 --dist loadfile --no-loadscope-reorder` (see the Makefile) the workers take whole
files in this order, so no long file starts last while the other worker idles. Seconds of wall time per file under
`-n 2` on 2 cores: the sum of its setup, call and teardown times in one run of the suite (`--durations=0`, 2026-12-02).
A file not listed runs after these, in collection order."""
COST = {"test_fits": 90, "test_nothing_lost": 150, "test_browser": 85, "test_launch": 60, "test_gather": 59,
        "test_cli": 50, "test_hazards": 50,
        "test_plan_fidelity": 44, "test_moe": 31, "test_script_guide": 30, "test_device_check": 28, "test_export": 23,
        "test_gather_ranks": 20, "test_book": 18, "test_measure": 17, "test_gather_sharded": 14, "test_doctor": 10,
        "test_notebooks": 8, "test_shards": 4, "test_prior_art": 3, "test_readme": 3}

def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -COST.get(item.path.stem, 0))   # stable: a file's tests keep their order

"""Longest files first: under `-n 2 --dist loadfile --no-loadscope-reorder` (see the Makefile) the workers take whole
files in this order, so no long file starts last while the other worker idles. The cost is CPU-seconds per file: the
user+system time of pytest and every process it starts (ranks, fork servers, browsers), the file run alone with
`-p no:cacheprovider` (2026-12-02, issue 30; on a 2-core machine shared with other jobs, so the wall seconds
beside them are high and vary, the CPU-seconds much less). `~`: not measured alone this time: 1.5 x its wall seconds
in the last suite run (the median ratio of the files measured; test_gather's also x 0.4, its covering array's saving;
test_fits_accuracy, new, its owner's estimate).
A file not listed runs after these, in collection order."""
COST = {"test_fits_accuracy": 220,   # 156 s + 65 s wall at load 0.5-2 (byte-equality rows, real ranks)
        "test_fits": 139,            # 317 s wall at load 6
        "test_browser": 121,         # 308 s wall alone: Chromium and Voila
        "test_hazards": 75,          # 183 s
        "test_moe": 72,              # 180 s
        "test_launch": 70,           # 135 s
        "test_gather_ranks": 60,     # 174 s
        "test_plan_fidelity": 57,    # 144 s (was 74 CPU-s, 219 s: its matrices are covering arrays now)
        "test_cli": 57,              # 213 s
        "test_export": 51,           # 161 s
        "test_script_guide": 41,     # 100 s
        "test_device_check": 40,     # 135 s
        "test_gather": 36,           # ~ (59 s x 0.4, its covering array)
        "test_book": 36,             # 89 s
        "test_shards": 32,           # 72 s
        "test_measure": 32,          # 62 s (was 51 CPU-s, 142 s: its matrix is a covering array)
        "test_gather_sharded": 29,   # 109 s
        "test_prior_art": 27,        # 110 s
        "test_nothing_lost": 25,     # 65 s (was 28 CPU-s, 76 s: the load matrix is a covering array)
        "test_notebooks": 17,        # 50 s
        "test_readme": 12,           # 50 s
        "test_doctor": 11,           # 34 s
        "test_structure": 2}         # 13 s

def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -COST.get(item.path.stem, 0))   # stable: a file's tests keep their order

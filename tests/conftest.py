"""Longest files first: under `-n 2 --dist loadfile --no-loadscope-reorder` (see the Makefile) the workers take whole
files in this order, so no long file starts last while the other worker idles. The cost is CPU-seconds per file: the
user+system time of pytest and every process it starts (ranks, fork servers, browsers), the file run alone with
`-p no:cacheprovider` under a child subreaper, so that fork servers and other orphans are reaped, and counted, too,
with the venv's .pyc files written as `make` lets them be (2026-12-02, issue 30; on a 2-core machine shared with other
jobs, so the wall seconds beside them vary, the CPU-seconds much less). `=`: not measured this time (its owner's, or
the previous measurement). tests/test_device_check.py and tests/test_install.py are not here: they run in `make test-oldest` only (see
the Makefile). A file not listed runs after these, in collection order."""
COST = {"test_fits_beyond": 84,     # 2026-12-07: every real-rank fits case of four launches in one (4 ranks, 28 cases)
        "test_fits_accuracy": 85,    # 2026-12-07: trace-equality rows (its real-rank cases moved to test_fits_beyond)
        "test_trainer_fits": 135,    # 2026-12-07: fits beside 16 real Trainer / accelerate / TRL steps, + TRL refusing
        "test_trainer": 100,         # 2026-12-07: the HF Trainer, 2 ranks, and a resume at 3 ranks (+12 s)
        "test_groups": 70,           # 2026-12-06: 2 ranks, 3 cases (70 s wall)
        "test_fits_sweep": 50,       # 2026-12-06: a sample of the sweep that changes with the commit
        "test_job": 33,              # 2026-12-06
        "test_fits_search": 45,      # 2026-12-07: the search against a scan, 3 ranks (24 s at load 6)
        "test_fits_check": 34,       # 2026-12-07: check=True on Phi-3; the CLI's --check finds Mamba's miss
        "test_partial_collective": 14,   # 2026-12-06: mostly waiting on the 2 s bound
        "test_fits_grouping": 59,    # 2026-12-03: 62 s wall (a sample of each group: 39 traces, not 80)
        "test_browser": 147,         # = (Chromium and Voila)
        "test_gather_ranks": 60,     # =
        "test_fits": 48,             # 412 s wall (B's figure, after the .pyc; was 139: the trace is faster)
        "test_gather": 36,           # =
        "test_book": 46,             # 2026-12-06: + every chapter's width, boxes at 1280 px in Chromium
        "test_hazards": 34,          # 90 s at load 7
        "test_moe": 31,              # 55 s
        "test_gather_sharded": 33,   # =
        "test_cli": 29,              # 37 s
        "test_launch": 25,           # 135 s (4 signal cases, not 6; many tensors on the fork server only)
        "test_plan_fidelity": 24,    # 65 s
        "test_export": 22,           # 40 s
        "test_script_guide": 17,     # 16 s
        "test_measure": 16,          # 32 s
        "test_shards": 16,           # 43 s
        "test_nothing_lost": 14,     # 60 s
        "test_prior_art": 13,        # 82 s
        "test_readme": 12,           # = (the Install section's run, tests/test_install.py, is make test-oldest's)
        "test_notebooks": 9,         # 42 s
        "test_doctor": 6,            # 31 s
        "test_flavour_defaults": 8,  # 2026-12-06
        "test_explore_signals": 55,  # 2026-12-06: three `lfk explore`, each stopped by one signal
        "test_answer_width": 90,     # 2026-12-06: every answer within 100 columns (67 s quiet)
        "test_structure": 8}         # 2026-12-07: + the plan walk (a tiny Llama planned under sys.setprofile)

def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: -COST.get(item.path.stem, 0))   # stable: a file's tests keep their order

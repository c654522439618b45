# One entry point for a fresh machine: `make demo` and `make test` create the project-local virtual environment,
# install torch 2.13.0 FIRST (a CPU build lies on disk here; plain `torch` would fetch a multi-GB CUDA build),
# then the package with its dev extras, and run. Both are idempotent: the install step re-runs only when
# settings.ini or setup.py change.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.lfk-installed
OUT    ?= demo_out

.PHONY: install demo test nbtest pytest export readme bench clean-nbs

$(STAMP): settings.ini setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip check
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m lora_fsdp_kit demo --out $(OUT)

test: $(STAMP)
	$(VENV)/bin/nbdev_test
	$(VENV)/bin/python -m pytest -q tests

nbtest: $(STAMP)
	$(VENV)/bin/nbdev_test

pytest: $(STAMP)
	$(VENV)/bin/python -m pytest -q tests

# after editing a notebook: export the library, clean the notebooks, render the README
export: $(STAMP)
	$(VENV)/bin/nbdev_export
	$(VENV)/bin/nbdev_clean
	$(PY) -m lora_fsdp_kit readme

bench: $(STAMP)
	$(PY) bench/launch.py
	$(PY) bench/plan.py
	$(PY) bench/gather.py

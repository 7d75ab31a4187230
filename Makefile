# The two commands of the contract: `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt
	@# Graphviz draws `torchlower inspect --svg/--png`; best effort (root + apt only), never fatal
	@command -v dot >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
		{ DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz >/dev/null 2>&1 || \
		  { apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q graphviz >/dev/null 2>&1; }; }; } || \
		echo "note: Graphviz (dot) not installed; graph pictures will be unavailable"
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m torchlower.demo

lint: $(STAMP)
	$(BIN)/ruff check torchlower tests

test: $(STAMP) lint
	$(BIN)/python -m pytest -n 2 tests

clean:
	rm -rf $(VENV) build *.egg-info

# A long fuzzing campaign (tests/fuzz_campaign.py): make fuzz N=10000
N ?= 10000
fuzz: $(STAMP)
	$(BIN)/python -m tests.fuzz_campaign -n $(N)
.PHONY: fuzz

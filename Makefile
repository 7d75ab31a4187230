# The two commands of the contract: `make demo` and `make test`. Both set everything up first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint setup clean

setup: $(STAMP)

$(STAMP): pyproject.toml requirements-dev.txt
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

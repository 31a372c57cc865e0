# Two commands on a fresh machine: `make run` (the spiral demo) and `make test`.
PYTHON ?= python3.12
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: run test quick check docs bench install clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test]"
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/jaxwise spiral

# Everything CI runs: lint, types, the documentation site, then every test (slow ones too).
test: check docs
	$(BIN)/python -m pytest -n 2 --basetemp=build/pytest

# Local inner loop: skips tests marked `slow` (subprocesses, multi-process, long training).
quick: $(STAMP)
	$(BIN)/python -m pytest -n 2 --basetemp=build/pytest -m "not slow"

check: $(STAMP)
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples
	$(BIN)/pyright -p .

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir build/site

bench: $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[test,bench]"
	$(BIN)/jaxwise bench

clean:
	rm -rf $(VENV) runs build .pytest_cache

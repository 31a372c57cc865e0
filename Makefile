# Two commands on a fresh machine: `make run` (the spiral demo) and `make test`.
# `make test` is the newest lane (Python 3.12, the newest tested JAX and peers of
# .ci/newest.txt, every extra, lint, types, docs, every test); `make test-oldest` the oldest (Python 3.11, JAX 0.10.2 and the peers of
# .ci/oldest.txt, the non-slow tests). CI (.ci/run) runs both.
PYTHON ?= python3.12
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTHON_OLDEST ?= python3.11
OLD    := .venv-oldest
OLDSTAMP := $(OLD)/.installed
# Bytecode caches on: a machine that sets PYTHONDONTWRITEBYTECODE (CI's does) makes every one of
# the suite's ~300 Python subprocesses (doc blocks, examples, CLI runs) compile jaxwise from
# source again, and every pytest worker rewrite the test modules' assertions again.
unexport PYTHONDONTWRITEBYTECODE

.PHONY: run test test-oldest quick check docs bench bench-check install clean

install: $(STAMP)

$(STAMP): pyproject.toml .ci/newest.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c .ci/newest.txt -e ".[test]"
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/jaxwise spiral

# Everything CI runs: lint and types beside the documentation site (two jobs: two cores), then
# every test (slow ones too).
test: $(STAMP)
	$(MAKE) -j2 check docs
	$(BIN)/python -m pytest -n 2 --basetemp=build/pytest --durations=15

# The oldest lane checks that jaxwise runs on Python 3.11 and JAX 0.10.2: every test but the slow
# ones, these compositions of already-tested parts (DP mechanisms x samplers x wrappers,
# end-to-end CLI and training runs), whose JAX calls the unit tests make too, and the checks of
# the repository's own files (docstrings, layering, project files), which no JAX version
# changes; the newest lane runs them (CI time: 35 -> ~27 minutes for both lanes). The CLI's jobs
# (test_cli; the spiral job itself runs in test_spiral_precision and test_cli_edges) and the DP
# method choice at scale (test_dp_speed; its methods' own tests are test_ghost and
# test_per_example) joined them: ~180 test-seconds of the oldest lane's ~1,090.
# tests/test_project.py checks the list.
OLDEST_ONLY_NEWEST = test_rails test_privacy_mf test_train_dp test_compose_closed \
	test_privacy_unit test_cli_attack test_cli_mf test_audit test_label_errors \
	test_cli test_dp_speed test_nothing_lost test_train_compose test_train_convolution test_cli_fit test_jobs_overlap \
	test_label_errors_options test_fit_runs test_docstrings test_layering test_project

test-oldest: $(OLDSTAMP)
	@mkdir -p build
	$(OLD)/bin/python -m pytest -n 2 --basetemp=build/pytest-oldest -m "not slow" -p no:cacheprovider --durations=15 \
		$(foreach f,$(OLDEST_ONLY_NEWEST),--ignore=tests/$(f).py)

$(OLDSTAMP): pyproject.toml .ci/oldest.txt
	@test -x $(OLD)/bin/python || $(PYTHON_OLDEST) -m venv $(OLD)
	$(OLD)/bin/python -m pip install --quiet --upgrade pip
	$(OLD)/bin/python -m pip install --quiet -c .ci/oldest.txt -e ".[test-run]"
	@touch $(OLDSTAMP)

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

# Before resolving an issue that touches a hot path: the timed hot paths as in-run ratios
# against benchmarks/baselines.json (exit 1 on a regression; not part of `make test`).
bench-check: $(STAMP)
	$(BIN)/python benchmarks/bench_check.py

clean:
	rm -rf $(VENV) $(OLD) runs build .pytest_cache

"""Every case of the diagnostics corpus (tests/watch_corpus.py) gives its exact expected answer.

benchmarks/bench_diagnostics_corpus.py scores the same cases (and the lint corpus) as tables.
"""

import warnings

import jax
import pytest
import watch_corpus


def _marks(case):
    marks = [pytest.mark.xfail(reason=case.known_limit, strict=True)] if case.known_limit else []
    if case.cpu_only:
        marks.append(pytest.mark.skipif(jax.default_backend() != "cpu", reason=case.cpu_only))
    return marks


def _params(cases):
    return [pytest.param(case, id=case.name, marks=_marks(case)) for case in cases]


def _run(case):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # disable_jit's one-time audit notice
        return case.run()


@pytest.mark.parametrize("case", _params(watch_corpus.RECOMPILES))
def test_recompile_explanation(case):
    assert _run(case) == case.expected


@pytest.mark.parametrize("case", _params(watch_corpus.NANS))
def test_nan_location(case):
    assert _run(case) == case.expected


@pytest.mark.parametrize("case", _params(watch_corpus.DONATIONS))
def test_donation_finding(case):
    assert _run(case) == case.expected
    assert jax.jit is watch_corpus.jax.jit  # the watch restored jax.jit

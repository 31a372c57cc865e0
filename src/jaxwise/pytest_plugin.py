"""pytest plugin: ``@pytest.mark.compile_budget(n, name=None, exact=False)``.

Registered through the ``pytest11`` entry point, so installing jaxwise is
enough. A marked test fails when its body compiles more than ``n`` jitted
programs (optionally only those of ``name``: a function name, a jitted
function or an object with ``.jitted``); with ``exact=True`` any other count
fails too. The failure lists every compile with the reason it happened.

Eager operations outside ``jit`` (``jnp.ones(3)``: programs defined inside
JAX, compiled once per process and shape) are not counted by default, so a
test gives the same result run alone (``-k``) and in its whole file; pass
``include_eager=True`` to count them.

Example::

    @pytest.mark.compile_budget(1, name="step")
    def test_training_compiles_once():
        for batch in batches:
            state = step(state, batch)

JAX is imported only when a marked test runs.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["pytest_configure", "pytest_runtest_call"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "compile_budget(max_compiles, name=None, exact=False): fail the test if it compiles "
        "more than max_compiles jitted programs (of `name`, if given; exactly, with exact=True)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    marker = item.get_closest_marker("compile_budget")
    if marker is None:
        return (yield)
    from jaxwise.compilation import CompileBudget

    # The budget raises CompileBudgetExceeded on exit; a failing test body
    # propagates its own error and nothing is stacked on top.
    kwargs = {"include_eager": False, **marker.kwargs}
    with CompileBudget(*marker.args, **kwargs):
        result = yield
    return result

"""pytest plugin: ``@pytest.mark.compile_budget(n, name=None)``.

Registered through the ``pytest11`` entry point, so installing jaxwise is
enough. A marked test fails when its body compiles more than ``n`` XLA
programs (optionally only those of the function called ``name``); the
failure lists every compile with JAX's explanation of why it happened.

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
        "compile_budget(max_compiles, name=None): fail the test if it performs more than "
        "max_compiles XLA compilations (of the function `name`, if given)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    marker = item.get_closest_marker("compile_budget")
    if marker is None:
        return (yield)
    from jaxwise.compilation import CompileBudget

    # The budget raises CompileBudgetExceeded on exit; a failing test body
    # propagates its own error and nothing is stacked on top.
    with CompileBudget(*marker.args, **marker.kwargs):
        result = yield
    return result

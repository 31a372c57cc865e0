"""The hooks of jaxwise's pytest plugin (`jaxwise.pytest_plugin` re-exports them)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

__all__ = ["pytest_configure", "pytest_runtest_call"]


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``compile_budget`` marker (pytest calls this hook once per session).

    Args:
        config: pytest's configuration object.
    """
    config.addinivalue_line(
        "markers",
        "compile_budget(max_compiles, target=None, exact=False): fail the test if it compiles "
        "more than max_compiles jitted programs (of `target`, if given; exactly, with exact=True)",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    """Run a test marked ``compile_budget`` inside a `CompileBudget` (a pytest hook wrapper).

    Eager operations are not counted unless the marker says ``include_eager=True``.

    Args:
        item: the test being run.

    Yields:
        Control to pytest, which runs the test body inside the budget.

    Raises:
        CompileBudgetExceeded: the test compiled more than its budget (or, with ``exact``,
            another number).
    """
    marker = item.get_closest_marker("compile_budget")
    if marker is None:
        return (yield)
    from jaxwise.compilation import CompileBudget

    # The budget raises CompileBudgetExceeded on exit; a failing test body
    # propagates its own error and nothing is stacked on top.
    kwargs = {"include_eager": False, **marker.kwargs}
    with CompileBudget(*marker.args, **kwargs):
        return (yield)

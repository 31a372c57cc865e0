"""The hooks of jaxwise's pytest plugin (`jaxwise.pytest_plugin` re-exports them)."""

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
        return (yield)

"""JW009: ``print`` inside a jitted function (runs once, at trace time, and prints tracers)."""

from __future__ import annotations

import ast

from jaxwise.lint._index import Index

CODE = "JW009"
SUMMARY = "print inside a jitted function (runs once, at trace time)"


def check(ix: Index) -> None:
    """Flag the builtin ``print`` called directly in the body of a jitted function."""
    if "print" in ix.aliases.names or "print" in ix.bindings:
        return  # `print` is rebound: not the builtin
    by_fn = ix.jitted_by_fn()
    for call, scope in ix.calls.get("print", ()):
        if not isinstance(call.func, ast.Name) or scope is None or id(scope) not in by_fn:
            continue
        name = getattr(scope, "name", "?")
        ix.add(
            call,
            CODE,
            f"`print` inside jitted `{name}` runs once, while tracing, and shows tracers "
            "(e.g. `JitTracer(float32[])`), not values; later calls print nothing",
            'use jax.debug.print("x = {x}", x=x), which prints the values on every call',
        )

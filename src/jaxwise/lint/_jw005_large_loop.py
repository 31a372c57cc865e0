"""JW005: a Python ``for`` over a large or static ``range`` inside a jitted function (unrolled)."""

from __future__ import annotations

import ast

from jaxwise.lint._core import const_int, params, static_names
from jaxwise.lint._index import Index

CODE = "JW005"
SUMMARY = "Python for-loop over a large or static range inside a jitted function"
LIMIT = 100
_FIX = "use jax.lax.fori_loop or jax.lax.scan (one copy of the body, any trip count)"


def range_length(call: ast.Call, consts: dict[str, int]) -> int | None:
    """Trip count of ``range(…)`` with literal or module-constant bounds, else ``None``."""
    values = [const_int(a, consts) for a in call.args]
    if not values or None in values or len(values) > 3 or call.keywords:
        return None
    ints = [v for v in values if v is not None]
    if len(ints) == 1:
        return max(0, ints[0])
    step = ints[2] if len(ints) == 3 else 1
    return max(0, (ints[1] - ints[0] + step - 1) // step) if step > 0 else None


def check(ix: Index) -> None:
    """Flag unrolled loops: ≥ LIMIT iterations, or a trip count set by a static argument."""
    consts = ix.consts()
    for loop, scope in ix.range_loops:
        fn = ix.enclosing_jitted(scope)
        if fn is None:
            continue
        call = loop.iter
        assert isinstance(call, ast.Call)
        n = range_length(call, consts)
        if n is not None and n >= LIMIT:
            ix.add(
                loop,
                CODE,
                f"Python loop of {n} iterations inside jitted `{fn.name}` is unrolled into "
                f"the program ({n} copies of the body: slow compiles, big programs)",
                _FIX,
            )
            continue
        if scope is not fn or not call.args:
            continue
        bound = call.args[1] if len(call.args) > 1 else call.args[0]
        static = set().union(*(static_names(j.site, params(fn)) for j in ix.jitted_by_fn()[id(fn)]))
        if isinstance(bound, ast.Name) and bound.id in static:
            ix.add(
                loop,
                CODE,
                f"Python loop over `{ast.unparse(call)}` bounded by static argument "
                f"`{bound.id}` of jitted `{fn.name}` is unrolled: `{bound.id}` copies of "
                f"the body, and a new compile for every value of `{bound.id}`",
                _FIX,
            )

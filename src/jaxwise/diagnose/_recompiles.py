"""Why did it recompile: each compile of a series of calls, classified, with the fix."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxwise._checks import check_callable
from jaxwise.compilation import CompileCounter, CompileEvent

__all__ = ["FIXES", "Recompile", "why_recompiled"]


FIXES = {
    "first compile": "nothing to fix: every program compiles once",
    "shape": "pad inputs to a few fixed shapes (jaxwise.buckets) or make the varying dimension "
    "static on purpose",
    "dtype": "cast inputs to one dtype before the call",
    "weak type": "pass the same kind of value every call: always a Python scalar, or always "
    "jnp.asarray(v, dtype) (a committed dtype)",
    "static value": "a static argument changed value: make it a traced argument, or accept one "
    "program per value",
    "static identity": "the static argument is hashed by identity: make its class "
    "@dataclass(frozen=True) or register it with jax.tree_util.register_static, or reuse one "
    "instance",
    "pytree structure": "keep the argument structure fixed: no None-vs-array leaves, same dict "
    "keys, and call with the same convention (positional vs keyword, defaults omitted or not)",
    "sharding": "place inputs with the same sharding every call (jax.device_put with one "
    "NamedSharding)",
    "new function object": "create the jitted function once and reuse it (not jax.jit of a "
    "lambda, closure or bound method inside the call)",
    "config": "a JAX config flag (e.g. jax_enable_x64) flipped between calls; set it once, "
    "before the first call",
    "donation": "the same function is jitted both with and without donating an argument; jit "
    "it once with one donation setting",
    "eager operation": "an eager jnp operation outside jit compiled a small program; move it "
    "inside the jitted function or precompute it",
    "other": "see the explanation in `detail`",
}
"""``{category: what to do}`` for every ``Recompile.category``."""

_CATEGORY = {
    "first": "first compile",
    "shape": "shape",
    "dtype": "dtype",
    "weak_type": "weak type",
    "structure": "pytree structure",
    "sharding": "sharding",
    "config": "config",
    "donation": "donation",
    "new_function": "new function object",
    "other": "other",
}


@dataclasses.dataclass(frozen=True)
class Recompile:
    """One compilation during `why_recompiled`, classified.

    Attributes:
        call: index of the call that compiled.
        function: JAX's program name, e.g. ``"jit(step)"``.
        category: the human category, a key of [`FIXES`][jaxwise.diagnose.FIXES]
            (``"static value"`` and ``"static identity"`` split ``kind == "static"``).
        detail: the explanation.
        fix: what to do about it.
        kind: the [`CacheMiss`][jaxwise.compilation.CacheMiss] kind (``"static"``, ``"shape"``…), or
            ``"eager"`` for an eager operation and ``"other"`` when nothing is known.
        argument: the argument that changed, from the cache miss (``""`` when not
            applicable).
        old: its earlier value or type, as text.
        new: its new value or type, as text.
    """

    call: int
    function: str
    category: str
    detail: str
    fix: str
    kind: str = "other"
    argument: str = ""
    old: str = ""
    new: str = ""


def _as_call(spec: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(spec, dict) and set(spec) <= {"args", "kwargs"}:
        return tuple(spec.get("args", ())), dict(spec.get("kwargs", {}))
    if isinstance(spec, tuple):
        return spec, {}
    return (spec,), {}


def _classify(index: int, record: CompileEvent) -> Recompile:
    miss = record.explanation
    if miss is None:
        if record.internal:
            return Recompile(
                index,
                record.fun_name,
                "eager operation",
                record.describe(),
                FIXES["eager operation"],
                "eager",
            )
        return Recompile(index, record.fun_name, "other", record.describe(), FIXES["other"])
    if miss.kind == "static":
        category = "static identity" if miss.note == "hashed by identity" else "static value"
    else:
        category = _CATEGORY[miss.kind]
    return Recompile(
        index,
        record.fun_name,
        category,
        miss.summary,
        FIXES[category],
        miss.kind,
        miss.argument,
        miss.old,
        miss.new,
    )


def why_recompiled(fn: Callable[..., Any], calls: Sequence[Any]) -> list[Recompile]:
    """Run ``fn`` on each call and classify every compilation it causes.

    The classification reads the structured cache miss of each compile: what JAX's cache key
    of this call has that no earlier key of the same function had.

    Args:
        fn: a jitted function (or any function that calls jitted code).
        calls: each a tuple of positional arguments, a single argument, or
            ``{"args": (...), "kwargs": {...}}``.

    Returns:
        One [`Recompile`][jaxwise.diagnose.Recompile] per compilation, in order, with
            ``kind``/``argument``/``old``/``new``, a ``category`` among the keys of
            [`FIXES`][jaxwise.diagnose.FIXES], and the ``fix`` for it.

    Raises:
        TypeError: ``fn`` is not callable or ``calls`` is not a sequence.

    Examples:
        >>> import jax
        >>> f = jax.jit(lambda x, n: x * n, static_argnums=1)
        >>> first, second = why_recompiled(f, [(1.0, 2), (1.0, 3)])
        >>> first.kind, second.kind, second.argument, second.old, second.new
        ('first', 'static', 'n', '2', '3')
    """
    check_callable(fn, "fn")
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise TypeError(f"`calls` must be a sequence of calls, got {type(calls).__name__}")
    results: list[Recompile] = []
    for index, spec in enumerate(calls):
        args, kwargs = _as_call(spec)
        with CompileCounter() as counter:
            jax.block_until_ready(fn(*args, **kwargs))
        results.extend(_classify(index, record) for record in counter.records)
    return results

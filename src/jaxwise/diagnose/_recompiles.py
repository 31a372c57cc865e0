"""Why did it recompile: each call's compiles as `CacheMiss` records, and the fix for a miss."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax

from jaxwise._shared._checks import check_callable
from jaxwise.compilation import KINDS, CacheMiss, CompileCounter

__all__ = ["fix_for", "why_recompiled"]


_FIXES = {
    "first": "nothing to fix: every program compiles once",
    "shape": "pad inputs to a few fixed shapes (jaxwise.buckets) or make the varying dimension "
    "static on purpose",
    "dtype": "cast inputs to one dtype before the call",
    "weak_type": "pass the same kind of value every call: always a Python scalar, or always "
    "jnp.asarray(v, dtype) (a committed dtype)",
    "static": "a static argument changed value: make it a traced argument, or accept one "
    "program per value",
    "structure": "keep the argument structure fixed: no None-vs-array leaves, same dict "
    "keys, and call with the same convention (positional vs keyword, defaults omitted or not)",
    "sharding": "place inputs with the same sharding every call (jax.device_put with one "
    "NamedSharding)",
    "config": "a JAX config flag (e.g. jax_enable_x64) flipped between calls; set it once, "
    "before the first call",
    "donation": "the same function is jitted both with and without donating an argument; jit "
    "it once with one donation setting",
    "new_function": "create the jitted function once and reuse it (not jax.jit of a "
    "lambda, closure or bound method inside the call)",
    "eager": "an eager jnp operation outside jit compiled a small program; move it "
    "inside the jitted function or precompute it",
    "other": "see the miss's `text`",
}
_STATIC_IDENTITY = (
    "the static argument is hashed by identity: make its class @dataclass(frozen=True) or "
    "register it with jax.tree_util.register_static, or reuse one instance"
)
_IDENTITY_NOTE = "hashed by identity"  # `Difference.note` of a static object compared by `is`


def fix_for(miss: CacheMiss) -> str:
    """What to do about one compile: the fix for its [`CacheMiss`][jaxwise.compilation.CacheMiss].

    Looked up from the miss's ``kind`` (a static argument hashed by identity gets its own
    fix, read from the headline difference's ``note``).

    Args:
        miss: a cache miss, from [`why_recompiled`][jaxwise.diagnose.why_recompiled], a
            counter's records (``CompileEvent.miss``), ``explain_recompiles`` or a watch report.

    Returns:
        One line: what to change (for ``kind == "first"``: nothing).

    Raises:
        TypeError: ``miss`` is not a ``CacheMiss``.
        ValueError: its ``kind`` is not one of ``compilation.KINDS``.

    Examples:
        >>> import jax
        >>> first, second = why_recompiled(jax.jit(lambda x: x * 2), [(1.0,), (1,)])
        >>> fix_for(second[0])
        'cast inputs to one dtype before the call'
    """
    if not isinstance(miss, CacheMiss):
        raise TypeError(f"`miss` must be a compilation.CacheMiss, got {type(miss).__name__}")
    if miss.kind not in _FIXES:
        raise ValueError(f"`miss.kind` must be one of {KINDS}, got {miss.kind!r}")
    if miss.kind == "static" and miss.note == _IDENTITY_NOTE:
        return _STATIC_IDENTITY
    return _FIXES[miss.kind]


def _as_call(spec: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    if isinstance(spec, dict) and set(spec) <= {"args", "kwargs"}:
        return tuple(spec.get("args", ())), dict(spec.get("kwargs", {}))
    if isinstance(spec, tuple):
        return spec, {}
    return (spec,), {}


def why_recompiled(fn: Callable[..., Any], calls: Sequence[Any]) -> list[list[CacheMiss]]:
    """Run ``fn`` on each call and say why each of its compilations happened.

    Each compile is the structured [`CacheMiss`][jaxwise.compilation.CacheMiss] that caused
    it: what JAX's cache key of this call has that no earlier key of the same function had
    (``kind``, ``argument``, ``old``, ``new``). A compile JAX gave no miss for is a miss of
    kind ``"eager"`` (an eager operation outside ``jit``) or ``"other"``. The fix for each is
    [`fix_for(miss)`][jaxwise.diagnose.fix_for].

    Args:
        fn: a jitted function (or any function that calls jitted code).
        calls: each a tuple of positional arguments, a single argument, or
            ``{"args": (...), "kwargs": {...}}``.

    Returns:
        One list per call, in order: the misses of the compiles that call caused (empty when
            it compiled nothing).

    Raises:
        TypeError: ``fn`` is not callable or ``calls`` is not a sequence.

    Examples:
        >>> import jax
        >>> f = jax.jit(lambda x, n: x * n, static_argnums=1)
        >>> [first], [second] = why_recompiled(f, [(1.0, 2), (1.0, 3)])
        >>> first.kind, second.kind, second.argument, second.old, second.new
        ('first', 'static', 'n', '2', '3')
    """
    check_callable(fn, "fn")
    if isinstance(calls, (str, bytes)) or not isinstance(calls, Sequence):
        raise TypeError(f"`calls` must be a sequence of calls, got {type(calls).__name__}")
    results: list[list[CacheMiss]] = []
    for spec in calls:
        args, kwargs = _as_call(spec)
        with CompileCounter() as counter:
            jax.block_until_ready(fn(*args, **kwargs))
        results.append([record.miss for record in counter.records])
    return results

"""Runtime diagnosis: constants captured in programs, and why a function recompiled.

:func:`captured_constants` traces a function and lists the arrays baked into
its program (closures over concrete arrays become constants: bigger
programs, stale values, no gradients). :func:`why_recompiled` runs a series
of calls and classifies every recompile — shape, dtype, weak type, static
value, static identity, pytree structure, new function object — with the fix.

Example:
    >>> import jax, jax.numpy as jnp
    >>> f = jax.jit(lambda x: x * 2.0)
    >>> [r.category for r in why_recompiled(f, [(jnp.ones(3),), (jnp.ones(4),)])]
    ['first compile', 'shape']
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np

from jaxwise.compilation import CompileCounter, explain_recompiles

__all__ = ["CapturedConstant", "ConstantReport", "Recompile", "captured_constants", "why_recompiled"]


# --------------------------------------------------------------------------
# Captured constants
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CapturedConstant:
    """One array embedded in a traced program."""

    shape: tuple[int, ...]
    dtype: str
    bytes: int


@dataclasses.dataclass(frozen=True)
class ConstantReport:
    """What :func:`captured_constants` found.

    Attributes:
      constants: the embedded arrays, largest first.
      total_bytes: their total size.
      program_chars: size of the lowered StableHLO text as written.
      program_chars_without: the same program with the constants passed as
        arguments instead.
      flagged: ``total_bytes`` exceeds the threshold.
      verdict: one line for humans.
    """

    constants: tuple[CapturedConstant, ...]
    total_bytes: int
    program_chars: int
    program_chars_without: int
    flagged: bool
    verdict: str


def _collect_consts(closed: Any, out: list[Any]) -> None:
    """Constants of a closed jaxpr and of every closed jaxpr nested in its equations' params."""
    out.extend(getattr(closed, "consts", []))
    for eqn in getattr(getattr(closed, "jaxpr", closed), "eqns", []):
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(item, "eqns") or hasattr(getattr(item, "jaxpr", None), "eqns"):
                    _collect_consts(item, out)


def captured_constants(fn: Callable[..., Any], *args: Any, threshold_bytes: int = 64 * 1024,
                       **kwargs: Any) -> ConstantReport:
    """List the arrays ``fn`` embeds as constants when traced with ``args``.

    Traces with ``jax.make_jaxpr`` (nothing runs), collecting constants from
    nested jitted calls too, and lowers the program twice — as written, and
    with the constants hoisted into arguments — to show what they cost.

    Example:
        >>> import jax.numpy as jnp
        >>> a = jnp.ones((300, 300))
        >>> report = captured_constants(lambda x: a @ x, jnp.ones(300))
        >>> report.flagged, report.constants[0].shape
        (True, (300, 300))
    """
    if not callable(fn):
        raise TypeError(f"`fn` must be callable, got {type(fn).__name__}")
    with jax.disable_jit(True):  # inline nested jits so every constant is hoisted to the top level
        inlined = jax.make_jaxpr(fn)(*args, **kwargs)
    found: list[Any] = []
    _collect_consts(inlined, found)
    unique = {id(c): c for c in found}
    arrays = [c for c in unique.values() if hasattr(c, "shape") and hasattr(c, "dtype")]
    constants = sorted(
        (CapturedConstant(tuple(np.shape(c)), str(c.dtype), int(np.asarray(c).nbytes)) for c in arrays),
        key=lambda c: -c.bytes,
    )
    total = sum(c.bytes for c in constants)
    flat_args = jax.tree.leaves((args, kwargs))
    as_written = len(jax.jit(lambda *a: fn(*a[0], **a[1])).lower(args, kwargs).as_text())
    hoisted = jax.jit(lambda consts, flat: jax.core.eval_jaxpr(inlined.jaxpr, consts, *flat))
    without = len(hoisted.lower(list(inlined.consts), flat_args).as_text())
    flagged = total > threshold_bytes
    if not constants:
        verdict = "no captured arrays: every array is an argument"
    elif flagged:
        verdict = (f"{len(constants)} captured array(s), {total / 1024:.0f} KiB embedded in the program "
                   f"({as_written / 1024:.0f} KiB of StableHLO vs {without / 1024:.0f} KiB as arguments): "
                   "pass them as arguments (stale values, no gradients, slow compiles otherwise)")
    else:
        verdict = f"{len(constants)} small captured array(s), {total} bytes: below the {threshold_bytes}-byte threshold"
    return ConstantReport(tuple(constants), total, as_written, without, flagged, verdict)


# --------------------------------------------------------------------------
# Why recompiled
# --------------------------------------------------------------------------

FIXES = {
    "first compile": "nothing to fix: every program compiles once",
    "shape": "pad inputs to a few fixed shapes (jaxwise.buckets) or make the varying dimension static on purpose",
    "dtype": "cast inputs to one dtype before the call",
    "weak type": "pass the same kind of value every call: always a Python scalar, or always "
                 "jnp.asarray(v, dtype) (a committed dtype)",
    "static value": "a static argument changed value: make it a traced argument, or accept one program per value",
    "static identity": "the static argument is hashed by identity: make its class @dataclass(frozen=True) or "
                       "register it with jax.tree_util.register_static, or reuse one instance",
    "pytree structure": "keep the argument structure fixed: no None-vs-array leaves, same dict keys, and call "
                        "with the same convention (positional vs keyword, defaults omitted or not)",
    "new function object": "create the jitted function once and reuse it (not jax.jit of a lambda, closure or "
                           "bound method inside the call)",
    "tracing context": "a config flag or context manager changed between calls; keep it fixed",
    "eager operation": "an eager jnp operation outside jit compiled a small program; move it inside the jitted "
                       "function or precompute it",
    "other": "see the JAX explanation in `detail`",
}


@dataclasses.dataclass(frozen=True)
class Recompile:
    """One compilation during :func:`why_recompiled`, classified."""

    call: int
    function: str
    category: str
    detail: str
    fix: str


_TYPE = re.compile(r"^(?P<dtype>[a-z]+[0-9]*)\[(?P<shape>[^\]]*)\](?P<rest>.*)$")


def _classify_types(reason: str) -> str:
    match = re.search(r": (?P<old>\S+) → (?P<new>\S+)$", reason)
    if match is None:
        return "shape"
    old, new = match.group("old"), match.group("new")
    if ("weak_type=True" in old) != ("weak_type=True" in new):
        return "weak type"
    mo, mn = _TYPE.match(old), _TYPE.match(new)
    if mo and mn and mo.group("dtype") != mn.group("dtype"):
        return "dtype"
    return "shape"


def _is_array(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic))


def _static_difference(call: tuple[tuple, dict], previous: tuple[tuple, dict] | None) -> tuple[str, str]:
    if previous is None:
        return "static value", "a static argument differs from every earlier call"
    pairs = list(zip(call[0], previous[0])) + [(call[1][k], previous[1][k]) for k in call[1] if k in previous[1]]
    names = [f"argument {i}" for i in range(len(call[0]))] + [f"`{k}`" for k in call[1] if k in previous[1]]
    for name, (new, old) in zip(names, pairs):
        if _is_array(new) or _is_array(old):
            continue
        try:
            equal = bool(new == old)
        except Exception:  # noqa: BLE001 - exotic __eq__: treat as different values
            equal = False
        if not equal and _same_contents(new, old):
            return "static identity", (f"{name}: a {type(new).__name__} with the same contents but a different "
                                       "identity (its class compares and hashes by identity)")
        if not equal:
            return "static value", f"{name}: {old!r} → {new!r}"
        if new is not old and type(new).__hash__ is object.__hash__:
            return "static identity", (f"{name}: an equal but different {type(new).__name__} object "
                                       "(its hash is its identity)")
    return "static value", "a static argument (value or identity) differs from the earlier calls"


def _same_contents(a: Any, b: Any) -> bool:
    """Equal attribute dicts on two instances of a class with identity ``__eq__``."""
    if type(a) is not type(b) or type(a).__eq__ is not object.__eq__ or not hasattr(a, "__dict__"):
        return False
    try:
        return bool(vars(a) == vars(b))
    except Exception:  # noqa: BLE001
        return False


def _as_call(spec: Any) -> tuple[tuple, dict]:
    if isinstance(spec, dict) and set(spec) <= {"args", "kwargs"}:
        return tuple(spec.get("args", ())), dict(spec.get("kwargs", {}))
    if isinstance(spec, tuple):
        return spec, {}
    return (spec,), {}


def _leaf_type(x: Any) -> tuple[Any, ...]:
    if isinstance(x, (bool, int, float, complex)):
        return ("scalar", type(x).__name__)  # Python scalars: weakly typed
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        aval = jax.typeof(x) if isinstance(x, jax.Array) else None
        return ("array", tuple(np.shape(x)), str(x.dtype), bool(getattr(aval, "weak_type", False)))
    return ("object", type(x).__name__)


def _own_diff(call: tuple[tuple, dict], previous: tuple[tuple, dict]) -> tuple[str, str] | None:
    """Classify the difference between two calls from their arguments alone (no JAX explanation)."""
    leaves_new, tree_new = jax.tree.flatten(call)
    leaves_old, tree_old = jax.tree.flatten(previous)
    if tree_new != tree_old:
        return "pytree structure", f"argument structure {tree_old} → {tree_new}"
    for i, (a, b) in enumerate(zip(leaves_new, leaves_old)):
        ta, tb = _leaf_type(a), _leaf_type(b)
        if ta[0] == "array" and tb[0] == "array" and ta != tb:
            if ta[1] != tb[1]:
                return "shape", f"leaf {i}: shape {tb[1]} → {ta[1]}"
            if ta[2] != tb[2]:
                return "dtype", f"leaf {i}: dtype {tb[2]} → {ta[2]}"
            return "weak type", f"leaf {i}: weak_type {tb[3]} → {ta[3]}"
        if {ta[0], tb[0]} == {"array", "scalar"}:
            return "weak type", f"leaf {i}: {'Python scalar' if tb[0] == 'scalar' else 'array'} → " \
                                f"{'Python scalar' if ta[0] == 'scalar' else 'array'}"
    category, detail = _static_difference(call, previous)
    if "differs from the earlier calls" not in detail:
        return category, detail
    return None


def why_recompiled(fn: Callable[..., Any], calls: Sequence[Any]) -> list[Recompile]:
    """Run ``fn`` on each call and classify every compilation it causes.

    JAX's own cache-miss explanation is used when it gives one; otherwise
    the calls' arguments are compared directly.

    Args:
      fn: a jitted function (or any function that calls jitted code).
      calls: each a tuple of positional arguments, a single argument, or
        ``{"args": (...), "kwargs": {...}}``.

    Returns:
      One :class:`Recompile` per compilation, in order, with ``category``
      among: first compile, shape, dtype, weak type, static value, static
      identity, pytree structure, new function object, tracing context,
      eager operation, other — and the ``fix`` for it.

    Example:
        >>> import jax
        >>> f = jax.jit(lambda x, n: x * n, static_argnums=1)
        >>> [r.category for r in why_recompiled(f, [(1.0, 2), (1.0, 3)])]
        ['first compile', 'static value']
    """
    if not callable(fn):
        raise TypeError(f"`fn` must be callable, got {type(fn).__name__}")
    results: list[Recompile] = []
    seen: set[Any] = set()
    history: list[tuple[tuple, dict]] = []
    for index, spec in enumerate(calls):
        call = _as_call(spec)
        with explain_recompiles(), CompileCounter() as counter:
            jax.block_until_ready(fn(*call[0], **call[1]))
        previous = history[-1] if history else None
        for record in counter.records:
            category, detail = _classify(record, call, previous, seen)
            results.append(Recompile(index, record.fun_name, category, detail, FIXES[category]))
        history.append(call)
    return results


def _classify(record: Any, call: tuple[tuple, dict], previous: tuple[tuple, dict] | None,
              seen: set[Any]) -> tuple[str, str]:
    miss = record.explanation
    if miss is None:
        inner = record.fun_name[4:-1] if record.fun_name.startswith("jit(") else record.fun_name
        if record.fun_name not in seen and hasattr(jax.lax, inner):
            return "eager operation", record.describe()
        first = record.fun_name not in seen
        seen.add(record.fun_name)
        if first or previous is None:
            return "first compile", record.fun_name
        diff = _own_diff(call, previous)
        return diff if diff is not None else ("new function object", f"{record.fun_name} compiled again with "
                                              "identical arguments: a new function object")
    ident = (miss.function, miss.defined_at)
    first = ident not in seen
    seen.update({ident, record.fun_name})
    if miss.kind == "new_function":
        return ("first compile" if first else "new function object"), miss.summary
    if miss.kind == "types":
        return _classify_types(miss.reasons[0]), miss.summary
    if miss.kind == "pytree":
        return "pytree structure", miss.summary
    if miss.kind == "context":
        return "tracing context", miss.summary
    if miss.kind == "unexplained":
        return _static_difference(call, previous)
    return "other", miss.summary

"""Captured constants: what a traced program holds fixed (arrays and Python scalars)."""

from __future__ import annotations

import dataclasses
import dis
import inspect
import types
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.core import eval_jaxpr

from jaxwise._shared._checks import check_callable, check_int

__all__ = ["CapturedConstant", "CapturedScalar", "ConstantReport", "captured_constants"]


# --------------------------------------------------------------------------
# Captured constants
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CapturedConstant:
    """One array embedded in a traced program.

    Attributes:
        shape: the array's shape.
        dtype: its dtype's name.
        bytes: its size in bytes.
        name: the global or closure variable that holds it (``""`` when it has none, e.g. an
            array computed from other constants).
    """

    shape: tuple[int, ...]
    dtype: str
    bytes: int
    name: str = ""


@dataclasses.dataclass(frozen=True)
class CapturedScalar:
    """A Python scalar the function reads from a global or a closure at trace time.

    Its value is baked into the program: changing the variable later has no effect on an
    already compiled function (a stale value, silently).

    Attributes:
        name: the variable's name.
        value: its value when traced, as text.
        scope: ``"global"`` or ``"closure"``.
    """

    name: str
    value: str
    scope: str


@dataclasses.dataclass(frozen=True)
class ConstantReport:
    """What `captured_constants` found.

    Attributes:
        constants: the embedded arrays, largest first.
        scalars: Python scalars read from globals or closures (baked in at trace time).
        total_bytes: the arrays' total size.
        program_chars: size of the lowered StableHLO text as written.
        program_chars_without: the same program with the constants passed as arguments instead.
        flagged: ``total_bytes`` exceeds the threshold, or a Python scalar *global* is read.
        verdict: one line for humans.
    """

    constants: tuple[CapturedConstant, ...]
    total_bytes: int
    program_chars: int
    program_chars_without: int
    flagged: bool
    verdict: str
    scalars: tuple[CapturedScalar, ...] = ()


def _collect_consts(closed: Any, out: list[Any]) -> None:
    """Constants of a closed jaxpr and of every closed jaxpr nested in its equations' params."""
    out.extend(getattr(closed, "consts", []))
    for eqn in getattr(getattr(closed, "jaxpr", closed), "eqns", []):
        for value in eqn.params.values():
            for item in value if isinstance(value, (tuple, list)) else (value,):
                if hasattr(item, "eqns") or hasattr(getattr(item, "jaxpr", None), "eqns"):
                    _collect_consts(item, out)


def _python_function(fn: Any) -> types.FunctionType | None:
    fn = inspect.unwrap(fn)
    fn = getattr(fn, "__func__", fn)
    return fn if isinstance(fn, types.FunctionType) else None


def _global_reads(code: types.CodeType) -> list[str]:
    """Names a code object (and the code nested in it) loads as globals, in order."""
    names: list[str] = []
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and isinstance(ins.argval, str):
            names.append(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names.extend(_global_reads(const))
    return list(dict.fromkeys(names))


_LIBRARIES = frozenset({"jaxwise", "jax", "jaxlib", "numpy", "optax", "flax", "equinox"})


def _is_user_function(value: Any) -> bool:
    """A Python function written by the user (not in an installed library)."""
    py = _python_function(value)
    if py is None:
        return False
    filename = py.__code__.co_filename
    package = str(getattr(py, "__module__", "") or "").split(".")[0]
    if package in _LIBRARIES or filename.startswith("<frozen"):
        return False
    return "site-packages" not in filename and "dist-packages" not in filename


def _variables(fn: Any, depth: int = 3, seen: set[int] | None = None) -> list[tuple[str, str, Any]]:
    """(name, scope, value) of every global and closure variable ``fn`` reads.

    User functions it calls by a global or closure name are followed too (``depth`` levels),
    since their reads are traced into the same program.
    """
    py = _python_function(fn)
    seen = set() if seen is None else seen
    if py is None or id(py) in seen:
        return []
    seen.add(id(py))
    out: list[tuple[str, str, Any]] = []
    for name in _global_reads(py.__code__):
        if name in py.__globals__:
            out.append((name, "global", py.__globals__[name]))
    for name, cell in zip(py.__code__.co_freevars, py.__closure__ or ()):
        try:
            out.append((name, "closure", cell.cell_contents))
        except ValueError:  # an empty cell
            continue
    if depth > 0:
        for _, _, value in list(out):
            if _is_user_function(value):
                out.extend(_variables(value, depth - 1, seen))
    return list({(n, scope): (n, scope, v) for n, scope, v in out}.values())


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (int, float, complex, np.number)) and not isinstance(
        value, (bool, np.bool_)
    )


def _verdict(
    constants: list[CapturedConstant],
    scalars: list[CapturedScalar],
    total: int,
    threshold: int,
    sizes: tuple[int, int],
) -> str:
    parts = []
    named = ", ".join(f"`{c.name}`" for c in constants if c.name)
    if not constants:
        parts.append("no captured arrays: every array is an argument")
    elif total > threshold:
        program, costs = "", "stale values, no gradients"
        # JAX >= 0.12.1 (and nested jits before it) passes captured arrays as arguments itself:
        # only a program that embeds them is bigger and slower to compile
        if sizes[0] > 2 * sizes[1]:
            program = (
                f" ({sizes[0] / 1024:.0f} KiB of StableHLO vs {sizes[1] / 1024:.0f} KiB "
                "as arguments)"
            )
            costs += ", slow compiles"
        parts.append(
            f"{len(constants)} captured array(s) {named}, {total / 1024:.0f} KiB fixed in the "
            f"program{program}: pass them as arguments ({costs} otherwise)"
        )
    else:
        parts.append(
            f"{len(constants)} small captured array(s) {named}, {total} bytes: below the "
            f"{threshold}-byte threshold".replace("  ", " ")
        )
    stale = [s for s in scalars if s.scope == "global"]
    if stale:
        listed = ", ".join(f"`{s.name}` (= {s.value})" for s in stale)
        parts.append(
            f"Python scalar global(s) read at trace time: {listed}; the compiled program keeps "
            "this value even after the global changes (stale value): pass it as an argument"
        )
    return "; ".join(parts)


def captured_constants(
    fn: Callable[..., Any], *args: Any, threshold_bytes: int = 64 * 1024, **kwargs: Any
) -> ConstantReport:
    """List what ``fn`` bakes into its program when traced with ``args``.

    Traces with ``jax.make_jaxpr`` (nothing runs), collecting array constants from nested
    jitted calls too, names each array after the global or closure variable holding it, and
    lowers the program twice — as written, and with the constants hoisted into arguments — to
    show what they cost. Python scalars read from module globals or closures are listed too:
    their trace-time value is baked in, so changing a global later silently has no effect.

    Args:
        fn: the function (jitted or not).
        *args: example arguments.
        threshold_bytes: arrays above this total are flagged.
        **kwargs: example keyword arguments.

    Returns:
        The [`ConstantReport`][jaxwise.diagnose.ConstantReport].

    Raises:
        TypeError: ``fn`` is not callable or ``threshold_bytes`` not an int.
        ValueError: ``threshold_bytes < 0``.

    Examples:
        >>> import jax.numpy as jnp
        >>> a = jnp.ones((300, 300))
        >>> report = captured_constants(lambda x: a @ x, jnp.ones(300))
        >>> report.flagged, report.constants[0].shape, report.constants[0].name
        (True, (300, 300), 'a')
    """
    check_callable(fn, "fn")
    threshold_bytes = check_int(threshold_bytes, "threshold_bytes", min_value=0)
    with jax.disable_jit(True):  # inline nested jits so every constant is hoisted to the top level
        inlined = jax.make_jaxpr(fn)(*args, **kwargs)
    found: list[Any] = []
    _collect_consts(inlined, found)
    unique = {id(c): c for c in found}
    variables = _variables(fn)
    names = {id(v): n for n, _, v in variables}
    constants = sorted(
        (
            CapturedConstant(
                tuple(np.shape(c)), str(c.dtype), int(np.asarray(c).nbytes), names.get(id(c), "")
            )
            for c in unique.values()
            if hasattr(c, "shape") and hasattr(c, "dtype")
        ),
        key=lambda c: -c.bytes,
    )
    scalars = [CapturedScalar(n, repr(v), scope) for n, scope, v in variables if _is_scalar(v)]
    total = sum(c.bytes for c in constants)
    flat_args = jax.tree.leaves((args, kwargs))
    as_written = len(jax.jit(lambda *a: fn(*a[0], **a[1])).lower(args, kwargs).as_text())
    hoisted = jax.jit(lambda consts, flat: eval_jaxpr(inlined.jaxpr, consts, *flat))
    without = len(hoisted.lower(list(inlined.consts), flat_args).as_text())
    flagged = total > threshold_bytes or any(s.scope == "global" for s in scalars)
    verdict = _verdict(constants, scalars, total, threshold_bytes, (as_written, without))
    return ConstantReport(
        tuple(constants), total, as_written, without, flagged, verdict, tuple(scalars)
    )

"""Find where a NaN (or inf) comes from, and check values at run time.

``jax_debug_nans`` has three gaps: it checks only the outputs of compiled
programs, it ignores ``inf`` unless ``jax_debug_infs`` is set too, and on JAX
0.12.0.1 it silently stops checking already-compiled functions once ``vmap``
has run anywhere in the process. :func:`locate_nan` closes them for one call:
it clears JAX's caches, turns the checks on for that call only (restoring
every flag afterwards, also on error), and then pinpoints the first
primitive that produced the NaN by evaluating the function's jaxpr equation
by equation — in the backward pass too, where ``jax_debug_nans`` alone only
names an anonymous ``mul``.

Example:
    >>> import jax, jax.numpy as jnp
    >>> report = locate_nan(jax.grad(lambda x: jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))), jnp.zeros(2))
    >>> report.primitive, report.phase
    ('mul', 'backward')
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from jaxwise.tree import path_names

__all__ = ["NanReport", "assert_finite", "checked", "locate_nan"]


@dataclasses.dataclass(frozen=True)
class Frame:
    """One user-code frame: file, line, function and the source line."""

    file: str
    line: int
    function: str
    source: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}: {self.source}"


@dataclasses.dataclass(frozen=True)
class NanReport:
    """Where a non-finite value first appeared.

    Attributes:
      primitive: the JAX primitive whose output first became non-finite
        from finite inputs (e.g. ``"log"``, ``"div"``, ``"mul"``).
      kind: ``"nan"`` or ``"inf"``.
      phase: ``"forward"`` or ``"backward"`` (inside a transpose, i.e. the
        reverse pass of ``grad``/``vjp``).
      frame: the innermost user-code frame that created the operation (for a
        backward operation: the forward line it differentiates), or ``None``.
      stack: all user-code frames, outermost first.
      name_stack: JAX's name stack of the operation (e.g. ``transpose(jvp())``).
      message: JAX's own ``FloatingPointError`` message, if it raised one.
    """

    primitive: str
    kind: Literal["nan", "inf"]
    phase: Literal["forward", "backward"]
    frame: Frame | None
    stack: tuple[Frame, ...]
    name_stack: str
    message: str

    def __str__(self) -> str:
        where = str(self.frame) if self.frame else "an unknown location"
        return f"{self.kind} produced by `{self.primitive}` in the {self.phase} pass at {where}"


# --------------------------------------------------------------------------
# User frames of an equation (the one place touching jaxpr source info)
# --------------------------------------------------------------------------

_JAX_DIRS = tuple(
    os.path.dirname(m.__file__) + os.sep for m in (jax, __import__("jaxlib")) if getattr(m, "__file__", None)
)
_THIS_FILE = os.path.abspath(__file__)


def _is_user_file(path: str) -> bool:
    return not path.startswith(_JAX_DIRS) and os.path.abspath(path) != _THIS_FILE


def _user_frames(source_info: Any) -> tuple[Frame, ...]:
    """User frames of an equation's ``source_info`` (outermost first).

    Uses ``eqn.source_info.traceback.frames`` (file_name, function_name,
    line_num); tests/test_debug.py::test_user_frames_from_source_info fails
    if JAX changes it.
    """
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return ()
    import linecache

    frames = []
    for f in traceback.frames:
        if _is_user_file(f.file_name):
            source = linecache.getline(f.file_name, f.line_num).strip()
            frames.append(Frame(f.file_name, f.line_num, f.function_name, source))
    return tuple(reversed(frames))


# --------------------------------------------------------------------------
# Equation-by-equation evaluation
# --------------------------------------------------------------------------

_INLINE_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_INLINE_PRIMITIVES = frozenset(
    {"pjit", "jit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call",
     "custom_vjp_call_jaxpr", "custom_lin"}
)


def _nonfinite_kind(values: list[Any], check_inf: bool) -> str | None:
    for v in values:
        dtype = getattr(v, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
            continue
        arr = np.asarray(v)
        if np.isnan(arr).any():
            return "nan"
        if check_inf and np.isinf(arr).any():
            return "inf"
    return None


def _sub_jaxpr(eqn: Any) -> tuple[Any, list[Any]] | None:
    if eqn.primitive.name not in _INLINE_PRIMITIVES:
        return None
    for name in _INLINE_PARAMS:
        sub = eqn.params.get(name)
        if sub is None:
            continue
        if hasattr(sub, "consts") and hasattr(sub, "jaxpr"):
            return sub.jaxpr, list(sub.consts)
        if hasattr(sub, "eqns"):
            return sub, []
    return None


def _walk(jaxpr: Any, consts: list[Any], args: list[Any], check_inf: bool) -> tuple[list[Any], Any]:
    """Evaluate ``jaxpr``; return (outputs, first offending equation or None)."""
    from jax.extend.core import Literal

    env: dict[Any, Any] = {}

    def read(v: Any) -> Any:
        return v.val if isinstance(v, Literal) else env[v]

    for var, val in zip(jaxpr.constvars, consts):
        env[var] = val
    for var, val in zip(jaxpr.invars, args):
        env[var] = val
    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        sub = _sub_jaxpr(eqn)
        if sub is not None:
            outvals, found = _walk(sub[0], sub[1], invals, check_inf)
            if found is not None:
                return outvals, found
        else:
            out = eqn.primitive.bind(*invals, **eqn.params)
            outvals = list(out) if eqn.primitive.multiple_results else [out]
            kind = _nonfinite_kind(outvals, check_inf)
            if kind is not None and _nonfinite_kind(invals, check_inf) is None:
                return outvals, (eqn, kind)
        for var, val in zip(eqn.outvars, outvals):
            env[var] = val
    return [read(v) for v in jaxpr.outvars], None


def _trace_unrolled(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The jaxpr of ``fn`` with ``scan``/``fori_loop`` bodies unrolled (under ``disable_jit``).

    Unrolling lets the walk see inside loop bodies; if a loop cannot be
    unrolled (e.g. zero-length scans), the ordinary jaxpr is used and a NaN
    from a loop is attributed to the loop primitive.
    """
    try:
        with jax.disable_jit(True):
            return jax.make_jaxpr(fn)(*args, **kwargs)
    except Exception:  # noqa: BLE001 - any failure: use the ordinary trace
        return jax.make_jaxpr(fn)(*args, **kwargs)


def _report(eqn: Any, kind: str, message: str) -> NanReport:
    stack = _user_frames(eqn.source_info)
    name_stack = str(getattr(eqn.source_info, "name_stack", ""))
    phase = "backward" if "transpose" in name_stack else "forward"
    return NanReport(eqn.primitive.name, kind, phase, stack[-1] if stack else None, stack, name_stack, message)  # type: ignore[arg-type]


def _flag_state() -> dict[str, Any]:
    return {name: getattr(jax.config, name) for name in ("jax_debug_nans", "jax_debug_infs", "jax_disable_jit")}


def locate_nan(fn: Callable[..., Any], *args: Any, check_inf: bool = False, **kwargs: Any) -> NanReport | None:
    """Run ``fn(*args, **kwargs)`` with NaN (and optionally inf) checks; report the first culprit.

    Steps: clear JAX's caches (so the checks apply even to programs compiled
    before, and even after a ``vmap`` ran in the process); run the call with
    ``jax_debug_nans`` (and ``jax_debug_infs`` if ``check_inf``); if a
    non-finite value reaches an output, trace ``fn`` to a jaxpr and evaluate
    it equation by equation to find the first primitive that produced it
    from finite inputs, in the forward or the backward pass. All config
    flags are restored afterwards, also on error.

    Cannot catch: a NaN that never reaches an output of ``fn`` (e.g. removed
    by a ``where``) — by design, since it does no harm there.
    ``jax.clear_caches()`` means later calls of your jitted functions compile
    once more.

    Args:
      fn: any function of arrays (jitted or not), e.g. ``jax.grad(loss)``.
      *args, **kwargs: its arguments.
      check_inf: also report ``inf``.

    Returns:
      A :class:`NanReport`, or ``None`` if every output is finite.

    Example:
        >>> import jax.numpy as jnp
        >>> def f(x):
        ...     return jnp.log(x) + 1.0
        >>> r = locate_nan(f, -jnp.ones(3))
        >>> r.primitive, r.phase, r.frame.function
        ('log', 'forward', 'f')
    """
    if not callable(fn):
        raise TypeError(f"`fn` must be callable, got {type(fn).__name__}")
    flags = _flag_state()
    message = ""
    out: Any = None
    try:
        jax.clear_caches()
        jax.config.update("jax_debug_nans", True)
        jax.config.update("jax_debug_infs", bool(check_inf))
        try:
            # JAX prints "Invalid nan value encountered ..." before re-running
            # de-optimized; the report carries that information instead.
            with contextlib.redirect_stdout(io.StringIO()):
                out = jax.block_until_ready(fn(*args, **kwargs))
        except FloatingPointError as err:
            message = str(err).splitlines()[0]
    finally:
        for name, value in flags.items():
            jax.config.update(name, value)
    if not message:
        leaves = jax.tree.leaves(out)
        if _nonfinite_kind(leaves, check_inf) is None:
            return None
    closed = _trace_unrolled(fn, args, kwargs)
    flat_args = jax.tree.leaves((args, kwargs))
    _, found = _walk(closed.jaxpr, list(closed.consts), flat_args, check_inf)
    if found is None:
        # Not visible op by op (e.g. inside a scan body): fall back to JAX's message.
        return NanReport("unknown", "nan", "forward", None, (), "", message or "non-finite output")
    return _report(found[0], found[1], message)


# --------------------------------------------------------------------------
# checkify and host-side checks
# --------------------------------------------------------------------------

_ERROR_SETS = {
    "float": checkify.float_checks,
    "nan": checkify.nan_checks,
    "div": checkify.div_checks,
    "index": checkify.index_checks,
    "user": checkify.user_checks,
    "all": checkify.all_checks,
}


def checked(fn: Callable[..., Any], errors: str = "float") -> Callable[..., tuple[Any, Any]]:
    """``jit(checkify(fn))``: returns ``(error, out)``; checks run on every call.

    Unlike ``jax_debug_nans`` the checks are part of the compiled program,
    so they keep working on cache hits, after ``vmap``, and inside ``scan``.
    Call ``error.throw()`` to raise, or ``error.get()`` for the message.

    Args:
      fn: the function to check.
      errors: ``"float"`` (NaN and division by zero, the default), ``"nan"``,
        ``"div"``, ``"index"`` (out-of-bounds indexing), ``"user"``
        (``checkify.check``) or ``"all"``.

    Example:
        >>> import jax.numpy as jnp
        >>> err, out = checked(lambda x: jnp.log(x))(jnp.array([-1.0]))
        >>> "nan generated by primitive: log" in err.get()
        True
    """
    if not callable(fn):
        raise TypeError(f"`fn` must be callable, got {type(fn).__name__}")
    if errors not in _ERROR_SETS:
        raise ValueError(f"`errors` must be one of {sorted(_ERROR_SETS)}, got {errors!r}")
    return jax.jit(checkify.checkify(fn, errors=_ERROR_SETS[errors]))


def _leaves_with_names(tree: Any) -> Iterator[tuple[str, Any]]:
    names = path_names(tree)
    yield from zip(names, jax.tree.leaves(tree))


def assert_finite(tree: Any, what: str = "values") -> None:
    """Raise ``FloatingPointError`` naming the first leaf of ``tree`` with a NaN or inf.

    A host-side check (it transfers each floating leaf), for use between
    steps, not inside ``jit``.

    Example:
        >>> import jax.numpy as jnp
        >>> assert_finite({"w": jnp.ones(2), "b": jnp.array([jnp.nan])}, "params")
        Traceback (most recent call last):
        ...
        FloatingPointError: params: non-finite values in `b`: 1 NaN, 0 inf of 1 entries
    """
    for name, leaf in _leaves_with_names(tree):
        dtype = getattr(leaf, "dtype", None)
        if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
            continue
        arr = np.asarray(leaf)
        nans, infs = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        if nans or infs:
            raise FloatingPointError(
                f"{what}: non-finite values in `{name or '<root>'}`: {nans} NaN, {infs} inf of {arr.size} entries"
            )

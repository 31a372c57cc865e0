"""Find where a NaN (or inf) comes from, and check values at run time.

``jax_debug_nans`` has gaps: it checks only the outputs of compiled programs, it ignores ``inf``
unless ``jax_debug_infs`` is set too, it stops checking already-compiled functions once ``vmap`` has
run anywhere in the process (JAX 0.12.0.1), and it stops at the *first* NaN — even one that a
``jnp.where`` later discards. [`locate_nan`][jaxwise.debug.locate_nan] does not rely on it: it runs
the call once (with the user's debug flags temporarily off), and if an output is not finite it
replays the function's jaxpr equation by equation, following the NaN's *provenance* from its
creation to the output. A NaN that a ``select_n`` (``jnp.where``) discards is not the culprit; the
report names the primitive that created the NaN reaching the output, whether that happened in the
forward or the backward pass, and the user's file:line.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> loss = lambda x: jnp.sum(jnp.where(x > 0, jnp.sqrt(x), 0.0))
    >>> report = locate_nan(jax.grad(loss), jnp.zeros(2))
    >>> report.primitive, report.phase
    ('mul', 'backward')
"""

from __future__ import annotations

import contextlib
import dataclasses
import linecache
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from jaxwise._checks import check_callable, check_choice
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
    """Where the non-finite value that reaches the output was created.

    Attributes:
      primitive: the JAX primitive that created it from values free of it (e.g. ``"log"``,
        ``"div"``, ``"mul"``); ``"argument"`` when it was already in an argument of ``fn``,
        ``"unknown"`` if the replay could not attribute it.
      kind: ``"nan"`` or ``"inf"``.
      phase: ``"forward"`` or ``"backward"`` (inside a transpose, i.e. the
        reverse pass of ``grad``/``vjp``).
      frame: the innermost user-code frame that created the operation (for a
        backward operation: the forward line it differentiates), or ``None``.
      stack: all user-code frames, outermost first.
      name_stack: JAX's name stack of the operation (e.g. ``transpose(jvp())``).
      message: a one-line summary (e.g. ``invalid value (nan) produced by `log` …``).
    """

    primitive: str
    kind: Literal["nan", "inf"]
    phase: Literal["forward", "backward"]
    frame: Frame | None
    stack: tuple[Frame, ...]
    name_stack: str
    message: str

    def __str__(self) -> str:
        if self.primitive == "argument":
            return f"{self.kind} already present in the input: {self.message}"
        where = str(self.frame) if self.frame else "an unknown location"
        return f"{self.kind} produced by `{self.primitive}` in the {self.phase} pass at {where}"


# --------------------------------------------------------------------------
# User frames of an equation (the one place touching jaxpr source info)
# --------------------------------------------------------------------------

_JAX_DIRS = tuple(
    os.path.dirname(str(m.__file__)) + os.sep
    for m in (jax, __import__("jaxlib"))
    if getattr(m, "__file__", None)
)
_JAXWISE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _user_frames(source_info: Any) -> tuple[Frame, ...]:
    """User frames of an equation's ``source_info`` (outermost first).

    JAX's frames are dropped, and so are jaxwise's own unless no other frame is left (a NaN
    inside a jaxwise helper is reported at the user's call of it). Uses
    ``eqn.source_info.traceback.frames`` (file_name, function_name, line_num);
    tests/test_debug.py::test_user_frames_from_source_info fails if JAX changes it.
    """
    traceback = getattr(source_info, "traceback", None)
    if traceback is None:
        return ()
    outside_jax = [f for f in traceback.frames if not f.file_name.startswith(_JAX_DIRS)]
    user = [f for f in outside_jax if not os.path.abspath(f.file_name).startswith(_JAXWISE_DIR)]
    chosen = user or [
        f for f in outside_jax if os.path.abspath(f.file_name) != os.path.abspath(__file__)
    ]
    frames = [
        Frame(
            f.file_name,
            f.line_num,
            f.function_name,
            linecache.getline(f.file_name, f.line_num).strip(),
        )
        for f in chosen
    ]
    return tuple(reversed(frames))


# --------------------------------------------------------------------------
# Equation-by-equation replay with provenance
# --------------------------------------------------------------------------

_INLINE_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")
_INLINE_PRIMITIVES = frozenset(
    {
        "pjit",
        "jit",
        "closed_call",
        "core_call",
        "remat",
        "checkpoint",
        "custom_jvp_call",
        "custom_vjp_call",
        "custom_vjp_call_jaxpr",
        "custom_lin",
    }
)


@dataclasses.dataclass(frozen=True)
class _Origin:
    """Where a tracked non-finite value was created: an equation, or an argument of ``fn``."""

    order: int  # replay order: the earliest origin wins when several merge
    kind: str
    eqn: Any = None
    argument: str = ""


def _bad_mask(value: Any, check_inf: bool) -> np.ndarray | None:
    """Boolean mask of tracked non-finite entries of ``value`` (None for non-float values)."""
    dtype = getattr(value, "dtype", None)
    if dtype is None or not jnp.issubdtype(dtype, jnp.inexact):
        return None
    arr = np.asarray(value)
    return ~np.isfinite(arr) if check_inf else np.isnan(arr)


def _bad_kind(value: Any, check_inf: bool) -> str | None:
    mask = _bad_mask(value, check_inf)
    if mask is None or not mask.any():
        return None
    return "nan" if np.isnan(np.asarray(value)).any() else "inf"


def _sub_jaxpr(eqn: Any, invals: list[Any]) -> tuple[Any, list[Any], list[Any]] | None:
    """``(jaxpr, consts, args)`` of a call-like equation (or the taken branch of a ``cond``)."""
    if eqn.primitive.name == "cond":
        branches = eqn.params["branches"]
        index = int(np.clip(np.asarray(invals[0]), 0, len(branches) - 1))
        return branches[index].jaxpr, list(branches[index].consts), invals[1:]
    if eqn.primitive.name not in _INLINE_PRIMITIVES:
        return None
    for name in _INLINE_PARAMS:
        sub = eqn.params.get(name)
        if sub is None:
            continue
        if hasattr(sub, "consts") and hasattr(sub, "jaxpr"):
            return sub.jaxpr, list(sub.consts), invals
        if hasattr(sub, "eqns"):
            return sub, [], invals
    return None


class _Replay:
    """Evaluates a jaxpr op by op, tagging each tracked non-finite value with its origin."""

    def __init__(self, check_inf: bool) -> None:
        self.check_inf = check_inf
        self.counter = 0

    def new_origin(self, kind: str, eqn: Any = None, argument: str = "") -> _Origin:
        self.counter += 1
        return _Origin(self.counter, kind, eqn, argument)

    def tag(self, value: Any, origin: _Origin | None) -> _Origin | None:
        return origin if _bad_kind(value, self.check_inf) is not None else None

    def run(
        self, jaxpr: Any, consts: list[Any], args: list[Any], origins: list[_Origin | None]
    ) -> tuple[list[Any], list[_Origin | None]]:
        from jax.extend.core import Literal

        env: dict[Any, tuple[Any, _Origin | None]] = {}

        def read(v: Any) -> tuple[Any, _Origin | None]:
            return (v.val, None) if isinstance(v, Literal) else env[v]

        for var, val in zip(jaxpr.constvars, consts):
            kind = _bad_kind(val, self.check_inf)
            env[var] = (
                val,
                self.new_origin(kind, argument="a captured constant") if kind else None,
            )
        for var, val, origin in zip(jaxpr.invars, args, origins):
            env[var] = (val, origin)
        for eqn in jaxpr.eqns:
            invals, in_origins = (
                map(list, zip(*(read(v) for v in eqn.invars))) if eqn.invars else ([], [])
            )
            sub = _sub_jaxpr(eqn, invals)
            if sub is not None:
                skip = len(invals) - len(sub[2])
                outvals, out_origins = self.run(sub[0], sub[1], sub[2], in_origins[skip:])
            else:
                out = eqn.primitive.bind(*invals, **eqn.params)
                outvals = list(out) if eqn.primitive.multiple_results else [out]
                out_origins = [self.origin_of(eqn, invals, in_origins, o) for o in outvals]
            for var, val, origin in zip(eqn.outvars, outvals, out_origins):
                env[var] = (val, origin)
        results = [read(v) for v in jaxpr.outvars]
        return [r[0] for r in results], [r[1] for r in results]

    def origin_of(
        self, eqn: Any, invals: list[Any], in_origins: list[_Origin | None], out: Any
    ) -> _Origin | None:
        kind = _bad_kind(out, self.check_inf)
        if kind is None:
            return None
        if eqn.primitive.name == "select_n":  # only the cases actually selected carry over
            pred = np.asarray(invals[0])
            candidates = []
            for i, (case, origin) in enumerate(zip(invals[1:], in_origins[1:])):
                mask = _bad_mask(case, self.check_inf)
                if (
                    origin is not None
                    and mask is not None
                    and (mask & (pred.astype(np.int64) == i)).any()
                ):
                    candidates.append(origin)
        else:
            candidates = [o for o in in_origins if o is not None]
        if candidates:
            return min(candidates, key=lambda o: o.order)
        return self.new_origin(kind, eqn)


def _trace_unrolled(fn: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """The jaxpr of ``fn`` with ``scan``/``fori_loop`` bodies unrolled (under ``disable_jit``).

    Unrolling lets the replay see inside loop bodies; if a loop cannot be
    unrolled, the ordinary jaxpr is used and a NaN from a loop is attributed
    to the loop primitive.
    """
    try:
        with jax.disable_jit(True):
            return jax.make_jaxpr(fn)(*args, **kwargs)
    except Exception:
        return jax.make_jaxpr(fn)(*args, **kwargs)


@contextlib.contextmanager
def _debug_flags_off() -> Iterator[None]:
    """Turn ``jax_debug_nans``/``jax_debug_infs`` off; restore the user's values (also on error)."""
    saved = {name: getattr(jax.config, name) for name in ("jax_debug_nans", "jax_debug_infs")}
    try:
        for name in saved:
            jax.config.update(name, False)
        yield
    finally:
        for name, value in saved.items():
            jax.config.update(name, value)


def _report(origin: _Origin) -> NanReport:
    kind: Literal["nan", "inf"] = "inf" if origin.kind == "inf" else "nan"
    if origin.eqn is None:
        return NanReport(
            "argument",
            kind,
            "forward",
            None,
            (),
            "",
            f"invalid value ({kind}) in {origin.argument}",
        )
    eqn = origin.eqn
    stack = _user_frames(eqn.source_info)
    name_stack = str(getattr(eqn.source_info, "name_stack", ""))
    phase: Literal["forward", "backward"] = "backward" if "transpose" in name_stack else "forward"
    message = f"invalid value ({kind}) produced by `{eqn.primitive.name}` in the {phase} pass"
    return NanReport(
        eqn.primitive.name, kind, phase, stack[-1] if stack else None, stack, name_stack, message
    )


def locate_nan(
    fn: Callable[..., Any], *args: Any, check_inf: bool = False, **kwargs: Any
) -> NanReport | None:
    """Run ``fn(*args, **kwargs)``; if an output is NaN (or inf), report where it was created.

    Steps: run the call once with ``jax_debug_nans``/``jax_debug_infs`` turned off (the
    user's settings are restored afterwards, also on error, so a user who keeps them on gets
    a report, not a ``FloatingPointError``); if every output is finite, return ``None``.
    Otherwise trace ``fn`` to a jaxpr (loops unrolled, ``cond`` branches followed) and
    replay it equation by equation, tagging every non-finite value with the equation that
    created it from non-finite-free inputs. Tags flow through every primitive; through
    ``select_n`` (``jnp.where``) only from the cases actually selected, so a NaN that a
    ``where`` discards is never blamed. The report names the creator of the NaN that
    reaches the output (the earliest one if several do).

    Nothing is recompiled: JAX's caches are left alone.

    Args:
        fn: any function of arrays (jitted or not), e.g. ``jax.grad(loss)``.
        *args: its positional arguments.
        check_inf: also track ``inf`` (by default a NaN created from an ``inf``, such as
            ``0 · inf`` in a backward pass, is blamed on the operation making the NaN).
        **kwargs: its keyword arguments.

    Returns:
        A [`NanReport`][jaxwise.debug.NanReport], or ``None`` if every output is finite.

    Raises:
        TypeError: ``fn`` is not callable.

    Examples:
        >>> import jax.numpy as jnp
        >>> def f(x, y):
        ...     return jnp.where(x > 0, jnp.log(x), 0.0) + jnp.sqrt(y - 5.0)
        >>> r = locate_nan(f, jnp.zeros(2), jnp.ones(2))
        >>> r.primitive, r.phase, r.frame.function
        ('sqrt', 'forward', 'f')
    """
    check_callable(fn, "fn")
    with _debug_flags_off():
        out = jax.block_until_ready(fn(*args, **kwargs))
        if all(_bad_kind(leaf, check_inf) is None for leaf in jax.tree.leaves(out)):
            return None
        closed = _trace_unrolled(fn, args, kwargs)
        replay = _Replay(bool(check_inf))
        flat, _ = jax.tree_util.tree_flatten_with_path((args, kwargs))
        arg_origins = []
        for path, leaf in flat:
            kind = _bad_kind(leaf, check_inf)
            label = "the argument " + _argument_name(path)
            arg_origins.append(replay.new_origin(kind, argument=label) if kind else None)
        _, out_origins = replay.run(
            closed.jaxpr, list(closed.consts), [leaf for _, leaf in flat], arg_origins
        )
    found = [o for o in out_origins if o is not None]
    if not found:  # the op-by-op replay disagrees with the compiled run (rare)
        return NanReport(
            "unknown", "nan", "forward", None, (), "", "non-finite output not reproduced op by op"
        )
    return _report(min(found, key=lambda o: o.order))


def _argument_name(path: tuple) -> str:
    """``args[0]['w']`` / ``scale`` for a flattened ``(args, kwargs)`` path."""
    head, rest = path[0], path[1:]
    if getattr(head, "idx", None) == 0 and rest:
        return f"args[{rest[0].idx}]" + jax.tree_util.keystr(rest[1:])
    if rest:
        return str(getattr(rest[0], "key", rest[0])) + jax.tree_util.keystr(rest[1:])
    return jax.tree_util.keystr(path)


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

    Returns:
        The jitted, checked function: same arguments as ``fn``, returning
        ``(error, fn's output)``.

    Raises:
        TypeError: ``fn`` is not callable.
        ValueError: an unknown ``errors``.

    Examples:
        >>> import jax.numpy as jnp
        >>> err, out = checked(lambda x: jnp.log(x))(jnp.array([-1.0]))
        >>> "nan generated by primitive: log" in err.get()
        True
    """
    check_callable(fn, "fn")
    check_choice(errors, "errors", tuple(sorted(_ERROR_SETS)))
    return jax.jit(checkify.checkify(fn, errors=_ERROR_SETS[errors]))


def _leaves_with_names(tree: Any) -> Iterator[tuple[str, Any]]:
    names = path_names(tree)
    yield from zip(names, jax.tree.leaves(tree))


def assert_finite(tree: Any, what: str = "values") -> None:
    """Raise ``FloatingPointError`` naming the first leaf of ``tree`` with a NaN or inf.

    A host-side check (it transfers each floating leaf), for use between
    steps, not inside ``jit``.

    Args:
        tree: any pytree; its floating-point and complex leaves are checked.
        what: what the tree is, for the message (``"params"``, ``"grads"``).

    Raises:
        FloatingPointError: a leaf holds a NaN or an infinity; the message names its path
            and counts.

    Examples:
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
                f"{what}: non-finite values in `{name or '<root>'}`: "
                f"{nans} NaN, {infs} inf of {arr.size} entries"
            )

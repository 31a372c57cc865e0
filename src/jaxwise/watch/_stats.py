"""What a `Watch` records per function: calls, times and its compiles, each a `CacheMiss`.

A compile arrives from `jaxwise.compilation` as a `CompileEvent`; `compile_miss` turns it into
the `CacheMiss` the report lists (attributed to the user's line that compiled), and
`explain_equinox` retells it by the user's own arguments when an Equinox ``filter_jit``
function recompiled (JAX itself sees only the flattened arrays).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from jaxwise.compilation import CacheMiss, CompileEvent, Difference
from jaxwise.watch import _arguments
from jaxwise.watch._patch import Tracked
from jaxwise.watch._report import FunctionReport

__all__ = [
    "CompileSink",
    "Stats",
    "compile_miss",
    "explain_equinox",
    "load_nan_checks",
    "pmap_program",
]

_MAX_SIGNATURES = 32  # user-level signatures kept per Equinox function
_PRIORITY = ("structure", "static", "shape", "dtype", "weak_type")


class Stats:
    """Everything recorded for one function (all function objects jitted at one place)."""

    def __init__(self, name: str, where: str | None, tracked: bool) -> None:
        self.name = name
        self.where = where
        self.calls: int | None = 0 if tracked else None
        self.live = True  # read by every counted call: False once the watch has ended
        self.first: tuple[int, int] = (0, 0)  # (event number, 0: a compile, 1: a jit): the order
        self.timed_calls = 0  # calls timed: checked ones, then a sample of counted ones
        self.timed_seconds = 0.0  # inside the timed calls
        self.timed_compile = 0.0  # tracing and compiling inside timed calls
        self.untimed_compile = 0.0  # tracing and compiling inside calls not timed
        self.compile_seconds = 0.0
        self.misses: list[CacheMiss] = []
        self.unusable: set[str] = set()  # avals JAX said it could not reuse
        self.nan_checked = False
        self.signatures: list[_arguments.Signature] = []  # Equinox: the user's arguments

    @property
    def call_seconds(self) -> float:
        """Time inside the calls: the timed calls, plus for the others their compiles and the
        timed calls' mean time outside compiling (``Tracked`` times a sample of its calls)."""
        untimed = (self.calls or 0) - self.timed_calls
        if untimed <= 0 or not self.timed_calls:
            return self.timed_seconds + self.untimed_compile
        steady = max(0.0, self.timed_seconds - self.timed_compile) / self.timed_calls
        return self.timed_seconds + self.untimed_compile + untimed * steady

    def charge(self, seconds: float, timed: bool | None, compile: bool = True) -> None:
        """Count ``seconds`` of tracing or compiling (``compile``: this function's), spent
        inside a call (timed or not) or outside any (``timed`` is ``None``)."""
        if compile:
            self.compile_seconds += seconds
        if timed:
            self.timed_compile += seconds
        elif timed is not None:
            self.untimed_compile += seconds

    def report(self, warmup: int) -> FunctionReport:
        return FunctionReport(
            self.name,
            self.where,
            self.calls,
            len(self.misses),
            self.compile_seconds,
            self.call_seconds,
            tuple(self.misses),
            warmup,
        )


def compile_miss(event: CompileEvent, where: str | None) -> CacheMiss:
    """The compile's `CacheMiss`, its ``call_site`` the user's line that compiled."""
    miss = event.miss
    if miss.kind == "eager":  # a pmap-ed program: defined inside JAX, called by the user
        miss = dataclasses.replace(miss, kind="other")
    return dataclasses.replace(miss, call_site=where)


def explain_equinox(stats: Stats, miss: CacheMiss, args: tuple, kwargs: dict) -> CacheMiss:
    """``miss`` told by the user's arguments of an Equinox ``filter_jit`` call."""
    arguments = _arguments.user_arguments(args, kwargs)
    if arguments is None:
        return miss
    current = _arguments.signature(arguments)
    diffs = _arguments.explain(stats.signatures, current) if stats.signatures else []
    stats.signatures = [*stats.signatures[-_MAX_SIGNATURES + 1 :], current]
    if not diffs or miss.kind in ("first", "new_function", "config"):
        return miss
    diffs.sort(key=lambda d: _PRIORITY.index(d.kind) if d.kind in _PRIORITY else len(_PRIORITY))
    head: Difference = diffs[0]
    reasons = tuple(d.describe() for d in diffs)
    return dataclasses.replace(
        miss,
        kind=head.kind,
        argument=head.argument,
        old=head.old,
        new=head.new,
        differences=tuple(diffs),
        reasons=reasons,
        text=f"{miss.function} recompiled: " + "; ".join(reasons),
    )


def pmap_program(tracked: Tracked, event: CompileEvent) -> bool:
    """Whether an internal compile during a ``pmap`` call is the pmap's own program (defined
    in JAX's ``pmap.py``/``pxla.py``); others (``jit(_multi_slice)``, splitting the result per
    device) are eager work, not a compile of the user's function."""
    where = event.defined_at or ""
    file = where.rpartition(":")[0] or where
    return tracked.kind == "pmap" and os.path.basename(file) in ("pmap.py", "pxla.py")


def load_nan_checks() -> Any:
    """``jaxwise.watch._nans``, imported before the watched code runs.

    Importing it (``jaxwise.debug``: ``checkify``, ``jax.extend``) defines JAX config options
    that are part of every jitted function's cache key; imported at the first NaN check it
    would change the key between a function's first and second call and compile it again.
    """
    from jaxwise.watch import _nans

    return _nans


class CompileSink:
    """Receives every compile from jaxwise.compilation's process-wide listener."""

    def __init__(self, watch: Any) -> None:  # a Watch
        self._watch = watch

    def record(self, event: CompileEvent) -> None:
        self._watch._on_compile(event)

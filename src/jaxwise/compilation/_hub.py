"""One process-wide listener: compile events, cache-miss explanations, and who wants them.

Every backend compilation is reported by ``jax.monitoring``
(``/jax/core/compile/backend_compile_duration``); every tracing-cache miss is explained by JAX on
its logger while ``jax_explain_cache_misses`` is on. `_Hub` listens to both, turns each miss into a
structured `CacheMiss` (from the cache keys, see `jaxwise._shared._jax`),
pairs it with the compilation it caused and hands the resulting
`CompileEvent` to every active counter. The explanations are not
printed unless the user turned ``jax_explain_cache_misses`` on themselves.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any, Literal

import jax

from jaxwise._shared import _jax as _jaxkeys
from jaxwise.compilation._explain import CacheMiss, from_context, parse_cache_miss, placement_miss

__all__ = ["HUB", "CompileEvent", "explain_recompiles", "subscribe"]

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_EXPLAIN_LOGGER = _jaxkeys.EXPLAIN_LOGGER  # JAX's tracing-cache-miss explanations
_MISS_HEADER = "TRACING CACHE MISS"
_MAX_PENDING = 64
_MAX_HISTORY = 32  # call signatures remembered per function definition


@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """One backend compilation.

    Attributes:
        fun_name: JAX's name of the compiled program, e.g. ``"jit(step)"``.
        seconds: backend compile time.
        explanation: the [`CacheMiss`][jaxwise.compilation.CacheMiss] that caused it, or
            ``None`` when none is known (an eager operation outside ``jit``, an AOT
            ``.lower().compile()`` of an already traced function).
        function: the Python function's name (``"step"``).
        defined_at: ``"file.py:LINE"`` of its definition, if known.
        internal: the program is defined inside JAX itself: an eager operation such as
            ``jnp.ones(3)`` or ``x * 2`` outside ``jit``.
        function_id: ``id`` of the traced Python function, when known (how a jitted target
            recognises its own programs).
    """

    fun_name: str
    seconds: float
    explanation: CacheMiss | None
    function: str = ""
    defined_at: str | None = None
    internal: bool = False
    function_id: int | None = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def source(self) -> str | None:
        """``"name at file:line"``, JAX's identity of the function, if known."""
        return f"{self.function} at {self.defined_at}" if self.defined_at else None

    @property
    def miss(self) -> CacheMiss:
        """Why it compiled, always as a [`CacheMiss`][jaxwise.compilation.CacheMiss].

        The ``explanation`` when there is one; otherwise a miss of kind ``"eager"`` for an
        eager operation outside ``jit`` (``internal``) or ``"other"`` (a program derived from
        an earlier trace, an AOT compile), its one reason saying so.
        """
        if self.explanation is not None:
            return self.explanation
        if self.internal:
            kind, reason = "eager", "an eager operation outside jit (a program defined inside JAX)"
        else:
            kind, reason = (
                "other",
                "no tracing-cache miss: a program derived from an earlier trace (by grad, "
                "vmap…) or an AOT compile of a traced function",
            )
        function = self.function or _inner_name(self.fun_name)
        text = f"{self.fun_name}: {reason}"
        return CacheMiss(function, self.defined_at, None, kind, "", "", "", (), (reason,), text)

    def describe(self) -> str:
        """One line: name, milliseconds and the reason.

        Returns:
            The line, e.g. ``"jit(step)   12.3 ms  shape of x: f32[3] -> f32[5]"``.
        """
        return f"{self.fun_name:<24} {1e3 * self.seconds:8.1f} ms  {self.miss.summary}"


def _inner_name(fun_name: str) -> str:
    return fun_name[4:-1] if fun_name.startswith("jit(") and fun_name.endswith(")") else fun_name


class _Hub:
    """Dispatches compile events and cache-miss explanations to active sinks."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._sinks: list[Any] = []
        self._explain_sinks: list[Any] = []
        self._listening = False
        self._explain_users = 0
        self._flag_before: bool | None = None
        self._filter = _CaptureFilter(self)
        self._quiet = _PersistentCacheFilter(self)
        self._local = threading.local()
        self._sources: dict[str, list[_jaxkeys.CallSig]] = {}
        self._placements: weakref.WeakKeyDictionary[Any, _Placement] = weakref.WeakKeyDictionary()

    # -- compile events -------------------------------------------------------
    def add_sink(self, sink: Any, explain: bool) -> None:
        with self._lock:
            if not self._listening:
                jax.monitoring.register_event_duration_secs_listener(self._on_duration)
                self._listening = True
            self._sinks.append(sink)
            if explain:
                self._acquire_explanations()

    def remove_sink(self, sink: Any, explain: bool) -> None:
        with self._lock:
            if sink in self._sinks:
                self._sinks.remove(sink)
                if explain:
                    self._release_explanations()

    def _on_duration(self, event: str, duration_secs: float, **kwargs: Any) -> None:
        if event != _COMPILE_EVENT or not self._sinks:
            return
        record = self._event(str(kwargs.get("fun_name", "?")), float(duration_secs))
        errors = []
        for sink in list(self._sinks):
            try:
                sink.record(record)
            except RuntimeError as err:  # raised by lifetime budgets
                errors.append(err)
        if errors:
            raise errors[0]

    def _event(self, fun_name: str, seconds: float) -> CompileEvent:
        ctx = _jaxkeys.compile_context()
        miss, fun_id = self._pop_pending(
            fun_name,
            ctx.defined_at if ctx is not None else None,
            ctx.name if ctx is not None else None,
        )
        if ctx is not None:
            previous = self._placements.get(ctx.jaxpr)
            try:
                self._placements[ctx.jaxpr] = _Placement.of(ctx)
            except TypeError:  # not weak-referenceable in this JAX version
                pass
            if miss is None and previous is not None:
                miss = _placement_miss(ctx, previous)
            return CompileEvent(
                fun_name, seconds, miss, ctx.name, ctx.defined_at, ctx.internal, fun_id
            )
        if miss is not None:
            return CompileEvent(
                fun_name, seconds, miss, miss.function, miss.defined_at, False, fun_id
            )
        return CompileEvent(fun_name, seconds, None, _inner_name(fun_name))

    # -- explanations ---------------------------------------------------------
    def add_explain_sink(self, sink: Any) -> None:
        with self._lock:
            self._explain_sinks.append(sink)
            self._acquire_explanations()

    def remove_explain_sink(self, sink: Any) -> None:
        with self._lock:
            if sink in self._explain_sinks:
                self._explain_sinks.remove(sink)
                self._release_explanations()

    def _acquire_explanations(self) -> None:
        if self._explain_users == 0:
            self._flag_before = bool(jax.config.jax_explain_cache_misses)
            logging.getLogger(_EXPLAIN_LOGGER).addFilter(self._filter)
            for name in _CACHE_LOGGERS:
                logging.getLogger(name).addFilter(self._quiet)
            if not self._flag_before:
                jax.config.update("jax_explain_cache_misses", True)
        self._explain_users += 1

    def _release_explanations(self) -> None:
        self._explain_users -= 1
        if self._explain_users == 0:
            logging.getLogger(_EXPLAIN_LOGGER).removeFilter(self._filter)
            for name in _CACHE_LOGGERS:
                logging.getLogger(name).removeFilter(self._quiet)
            if not self._flag_before:
                jax.config.update("jax_explain_cache_misses", False)
            self._flag_before = None

    @property
    def user_wants_explanations(self) -> bool:
        """True when the user had ``jax_explain_cache_misses`` on before us."""
        return bool(self._flag_before)

    def _pending(self) -> list[tuple[CacheMiss, int | None]]:
        pending = getattr(self._local, "pending", None)
        if pending is None:
            pending = self._local.pending = []
        return pending

    def explain(self, jax_text: str) -> CacheMiss:
        """Build the structured miss JAX is logging right now and queue it for its compile."""
        ctx = _jaxkeys.miss_context()
        fun_id = id(ctx.fun) if ctx is not None and ctx.fun is not None else None
        if ctx is not None:
            # A JAX-internal wrapper (grad's transpose…) keeps its own history: its programs
            # are not re-created copies of the user's function.
            source = f"{ctx.name} at {ctx.defined_at}" + (
                f" via {ctx.wrapper}" if ctx.wrapper else ""
            )
            recent = self._sources.setdefault(source, [])
            miss = from_context(ctx, bool(recent) and not ctx.previous, jax_text, recent)
            recent.append(ctx.new)
            del recent[:-_MAX_HISTORY]
        else:
            miss = parse_cache_miss(jax_text)
        pending = self._pending()
        pending.append((miss, fun_id))
        del pending[:-_MAX_PENDING]
        for sink in list(self._explain_sinks):
            sink.record(miss)
        return miss

    def _pop_pending(
        self, fun_name: str, defined_at: str | None, source_name: str | None = None
    ) -> tuple[CacheMiss | None, int | None]:
        """The newest queued miss of this function (same name and, when known, the same place
        of definition: a miss left by another function of that name, traced inside an outer
        jit and never compiled on its own, is not this compile's). A function renamed after
        its definition (``fn.__name__ = ...``) compiles under its new name but is traced
        under its ``def`` name (``source_name``): either matches."""
        pending = self._pending()
        names = {_inner_name(fun_name), source_name} - {None}
        for i in range(len(pending) - 1, -1, -1):
            miss = pending[i][0]
            same_place = defined_at is None or miss.defined_at in (None, defined_at)
            if miss.function in names and same_place:
                return pending.pop(i)
        return None, None


@dataclasses.dataclass(frozen=True)
class _Placement:
    """What a compile of an already traced program specialises on besides the trace."""

    shardings: tuple[str, ...]
    committed: tuple[bool | None, ...]
    donated: tuple[bool, ...]

    @classmethod
    def of(cls, ctx: _jaxkeys.CompileContext) -> _Placement:
        return cls(ctx.shardings, ctx.committed, ctx.donated)


def _committed_text(committed: bool | None, sharding: str) -> str:
    if committed is None:
        return sharding
    return f"committed ({sharding})" if committed else f"uncommitted ({sharding})"


def _placement_miss(ctx: _jaxkeys.CompileContext, previous: _Placement) -> CacheMiss:
    """A compile of an already traced program: an input's sharding, committed placement or
    donation changed (JAX's tracing cache hit, so it gave no explanation)."""

    def name(i: int) -> str:
        return ctx.arg_names[i] if i < len(ctx.arg_names) else f"args[{i}]"

    for i, (old, new) in enumerate(zip(previous.shardings, ctx.shardings)):
        if old != new:
            return placement_miss("sharding", ctx.name, ctx.defined_at, name(i), old, new)
    for i, (old, new) in enumerate(zip(previous.committed, ctx.committed)):
        if old != new and old is not None and new is not None:
            sharding = ctx.shardings[i]
            return placement_miss(
                "sharding",
                ctx.name,
                ctx.defined_at,
                name(i),
                _committed_text(old, sharding),
                _committed_text(new, sharding),
            )
    for i, (old, new) in enumerate(zip(previous.donated, ctx.donated)):
        if old != new:
            text = ("not donated", "donated")
            return placement_miss(
                "donation", ctx.name, ctx.defined_at, name(i), text[old], text[new]
            )
    reason = (
        "the same traced program compiled again with the same input placement and donation "
        "(a layout or compiler option changed, or its executable was evicted)"
    )
    return CacheMiss(ctx.name, ctx.defined_at, None, "other", "", "", "", (), (reason,), reason)


class _CaptureFilter(logging.Filter):
    """Captures JAX's cache-miss explanations; hides them unless the user asked for them."""

    def __init__(self, hub: _Hub) -> None:
        super().__init__()
        self._hub = hub

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_MISS_HEADER):
            return True
        self._hub.explain(message)
        return self._hub.user_wants_explanations


# JAX logs its persistent compilation cache's misses and writes at WARNING while
# ``jax_explain_cache_misses`` is on (else at DEBUG): hidden when the flag is on only for us.
_CACHE_LOGGERS = ("jax._src.compiler", "jax._src.compilation_cache")


class _PersistentCacheFilter(logging.Filter):
    """Hides the persistent cache's WARNING lines that only our explain flag raised."""

    def __init__(self, hub: _Hub) -> None:
        super().__init__()
        self._hub = hub

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.WARNING or self._hub.user_wants_explanations:
            return True
        return "persistent c" not in record.getMessage().lower()  # "... cache", "... compilation"


HUB = _Hub()


class _Listener:
    """A function as a sink of the hub (sinks have a ``record`` method)."""

    def __init__(self, listener: Callable[[CompileEvent], None]) -> None:
        self.record = listener


def subscribe(
    listener: Callable[[CompileEvent], None], *, explain: bool = True
) -> Callable[[], None]:
    """Call ``listener`` with every backend compilation of the process, until unsubscribed.

    What `CompileCounter` and ``jaxwise.watch`` are built on: each compilation arrives as a
    [`CompileEvent`][jaxwise.compilation.CompileEvent] while it happens (on the thread that
    compiles). With ``explain`` the event carries its
    [`CacheMiss`][jaxwise.compilation.CacheMiss] (``jax_explain_cache_misses`` is on while
    subscribed, its output hidden unless the user turned it on).

    Args:
        listener: called with each `CompileEvent`; a ``RuntimeError`` it raises propagates to
            the compiling call (how budgets stop a run).
        explain: also explain each compile (a little tracing overhead).

    Returns:
        ``unsubscribe()``: stops the calls (calling it twice does nothing).

    Raises:
        TypeError: ``listener`` is not callable or ``explain`` not a bool.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> seen, x = [], jnp.ones(2)
        >>> unsubscribe = subscribe(lambda event: seen.append(event.function))
        >>> def add_one(x): return x + 1
        >>> _ = jax.jit(add_one)(x)
        >>> unsubscribe()
        >>> [name for name in seen if not name.startswith("broadcast")]
        ['add_one']
    """
    if not callable(listener):
        raise TypeError(f"`listener` must be callable, got {type(listener).__name__}")
    if not isinstance(explain, bool):
        raise TypeError(f"`explain` must be a bool, got {explain!r}")
    sink = _Listener(listener)
    HUB.add_sink(sink, explain)
    return lambda: HUB.remove_sink(sink, explain)


class explain_recompiles:
    """Context manager collecting structured cache-miss explanations.

    Entering gives a list that fills with a [`CacheMiss`][jaxwise.compilation.CacheMiss]
    (function, kind, argument, old, new, reasons) for every tracing-cache miss in the
    block. Nothing is printed;
    ``jax_explain_cache_misses`` and the logger are restored on exit, also when the block
    raises.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def g(x): return x * 2
        >>> jg = jax.jit(g)
        >>> with explain_recompiles() as misses:
        ...     _ = jg(jnp.ones(3)); _ = jg(jnp.ones(5))
        >>> kinds = [m.kind for m in misses]
        >>> kinds, misses[1].argument, misses[1].old, misses[1].new
        (['first', 'shape'], 'x', 'f32[3]', 'f32[5]')
    """

    def __init__(self) -> None:
        self.records: list[CacheMiss] = []

    def record(self, miss: CacheMiss) -> None:
        """Called by the listener for every cache miss while the block runs.

        Args:
            miss: the explanation, appended to the list.
        """
        self.records.append(miss)

    def __enter__(self) -> list[CacheMiss]:
        HUB.add_explain_sink(self)
        return self.records

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        HUB.remove_explain_sink(self)
        return False

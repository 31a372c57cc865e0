"""Count, budget and explain real XLA compilations.

Every backend compilation JAX performs is reported through ``jax.monitoring``
(event ``/jax/core/compile/backend_compile_duration``). :class:`CompileCounter`
listens to those events; :class:`CompileBudget` turns a count into an
assertion; :func:`compile_budget` does the same for one jitted function over
its whole lifetime. Each recompile is paired with JAX's own cache-miss
explanation (``jax_explain_cache_misses``), captured from JAX's logger without
printing to stderr, so a budget failure says *why* the function recompiled::

    compile budget exceeded: 2 compilations, budget 1
      #1 jit(f)   14.2 ms  first compile of `f` (defined at model.py:12)
      #2 jit(f)    9.8 ms  argument `lr`: f32[]{weak_type=True} → f32[]{weak_type=False}

Example:
    >>> import jax, jax.numpy as jnp
    >>> f = jax.jit(lambda x: 2 * x)
    >>> a, b = jnp.ones(3), jnp.ones(4)
    >>> with CompileCounter() as counter:
    ...     _ = f(a); _ = f(a); _ = f(b)
    >>> counter.count
    2
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import re
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.extend.core

__all__ = [
    "CacheMiss",
    "CompileBudget",
    "CompileBudgetExceeded",
    "CompileCounter",
    "CompileEvent",
    "StageReport",
    "compile_budget",
    "count_eqns",
    "explain_recompiles",
    "parse_cache_miss",
    "stage_report",
]

_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
# JAX logs its tracing-cache-miss explanations from this module's logger
# (jax/_src/interpreters/partial_eval.py, ``explain``). It is the one private
# name we depend on; tests/test_compilation.py::test_explanations_are_captured
# fails if JAX moves it.
_EXPLAIN_LOGGER = "jax._src.interpreters.partial_eval"
_MISS_HEADER = "TRACING CACHE MISS"
_MAX_PENDING = 64

OnExceed = Literal["raise", "warn"]


class CompileBudgetExceeded(RuntimeError):
    """Raised when a block or function compiled more often than its budget.

    Attributes:
      max_compiles: the budget.
      events: every :class:`CompileEvent` counted, in order.
    """

    def __init__(self, message: str, max_compiles: int, events: list[CompileEvent]):
        super().__init__(message)
        self.max_compiles = max_compiles
        self.events = events


@dataclasses.dataclass(frozen=True)
class CacheMiss:
    """One tracing-cache miss, as explained by JAX.

    Attributes:
      function: name of the traced Python function, e.g. ``"step"``.
      defined_at: ``"file.py:LINE"`` where the function is defined, if known.
      call_site: ``"file.py:LINE:COL (caller)"`` of the call that missed.
      kind: ``"new_function"`` (JAX never saw this function object),
        ``"types"`` (shape / dtype / weak type of an argument),
        ``"pytree"`` (structure of the arguments, incl. ``None`` leaves,
        positional vs keyword), ``"context"`` (config / context manager),
        ``"debug_info"`` or ``"unexplained"`` (no difference visible to JAX:
        typically a static argument whose value or identity changed).
      reasons: one human-readable line per difference, e.g.
        ``"argument `x`: f32[3] → f32[4]"``.
      text: JAX's raw explanation.
    """

    function: str
    defined_at: str | None
    call_site: str | None
    kind: str
    reasons: tuple[str, ...]
    text: str

    @property
    def summary(self) -> str:
        """The reasons joined into one line."""
        return "; ".join(self.reasons)


@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """One backend compilation.

    Attributes:
      fun_name: JAX's name of the compiled program, e.g. ``"jit(step)"``.
      seconds: backend compile time.
      explanation: the :class:`CacheMiss` that caused it, or ``None`` when
        JAX gave none (eager primitives such as ``jnp.ones`` outside ``jit``,
        AOT ``.lower().compile()`` of an already traced function).
    """

    fun_name: str
    seconds: float
    explanation: CacheMiss | None

    def describe(self) -> str:
        """One line: name, milliseconds and the reason."""
        reason = self.explanation.summary if self.explanation else _no_explanation(self.fun_name)
        return f"{self.fun_name:<24} {1e3 * self.seconds:8.1f} ms  {reason}"


def _no_explanation(fun_name: str) -> str:
    del fun_name
    return "no JAX explanation (an eager operation outside jit, or an AOT compile)"


# --------------------------------------------------------------------------
# Parsing JAX's explanation text
# --------------------------------------------------------------------------

_RE_AT = re.compile(r"^TRACING CACHE MISS at (?P<site>.*):\s*$")
_RE_NEVER = re.compile(r"^\s*(?P<name>\S.*?) id=\d+(?: defined at (?P<loc>\S+))?\s*$")
_RE_FOR = re.compile(r"^\s*for (?P<name>.+?)(?: defined at (?P<loc>\S+))?\s*$")
_RE_TYPE = re.compile(r"^\s*\* at (?P<arg>.+?), now (?P<new>.+?) and before (?P<old>.+?)(?:https://\S*)?$")
_RE_TREE = re.compile(r"^\s*\* at input path (?P<path>\S+), now (?P<new>.+?) and before (?P<old>.+?), so (?P<why>.*)$")
_RE_CTX = re.compile(r"^\s*\* (?P<name>\S+) differs: now (?P<new>.+) and before (?P<old>.+)$")


def parse_cache_miss(text: str) -> CacheMiss:
    """Turn JAX's ``TRACING CACHE MISS`` log text into a :class:`CacheMiss`.

    Example:
        >>> m = parse_cache_miss("TRACING CACHE MISS at a.py:3 (g):\\n  for f defined at a.py:1\\n"
        ...     "  all previously seen cache keys differ. For the closest previous key:\\n"
        ...     "  different input types:\\n  * at x, now f32[4] and before f32[3]")
        >>> m.kind, m.reasons
        ('types', ('argument `x`: f32[3] → f32[4]',))
    """
    lines = text.splitlines()
    site = None
    if lines and (m := _RE_AT.match(lines[0])):
        site = m.group("site")
    body = lines[1:]
    function, loc = "?", None
    if any("never seen function" in line for line in body):
        for line in body:
            if m := _RE_NEVER.match(line):
                function, loc = m.group("name"), m.group("loc")
                break
        where = f" (defined at {loc})" if loc else ""
        reasons = [f"first compile of `{function}`{where}"]
        if any("same line" in line for line in body):
            reasons = [
                f"new function object `{function}`{where}: a function defined at the same place "
                "was compiled before; it is being re-created (jax.jit of a lambda, closure or "
                "bound method per call?) so JAX's cache cannot be reused"
            ]
        return CacheMiss(function, loc, site, "new_function", tuple(reasons), text)
    for line in body:
        if m := _RE_FOR.match(line):
            function, loc = m.group("name"), m.group("loc")
            break
    reasons: list[str] = []
    kind = "unexplained"
    joined = "\n".join(body)
    if "different input types" in joined:
        kind = "types"
        for line in body:
            if m := _RE_TYPE.match(line):
                reasons.append(f"argument `{m.group('arg')}`: {_short(m.group('old'))} → {_short(m.group('new'))}")
    elif "different input pytree" in joined:
        kind = "pytree"
        for line in body:
            if m := _RE_TREE.match(line):
                reasons.append(
                    f"input pytree at {m.group('path')}: {m.group('old')} → {m.group('new')} ({m.group('why')})"
                )
    elif "Tracing context" in joined:
        kind = "context"
        for line in body:
            if m := _RE_CTX.match(line):
                reasons.append(f"tracing context `{m.group('name')}`: {m.group('old')} → {m.group('new')}")
    elif "Debug info" in joined:
        kind = "debug_info"
        reasons.append("argument names differ (debug info)")
    if not reasons:
        if kind == "unexplained":
            reasons.append(
                "no difference in argument types or structure: a static argument changed "
                "value, or was an object hashed by identity"
            )
        else:
            reasons.append(joined.strip().splitlines()[-1].strip())
    return CacheMiss(function, loc, site, kind, tuple(reasons), text)


def _short(type_text: str) -> str:
    # "f32[3]({})" -> "f32[3]": drop an empty sharding annotation.
    return type_text.replace("({})", "")


# --------------------------------------------------------------------------
# The hub: one monitoring listener and one log filter for the whole process
# --------------------------------------------------------------------------


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
        self._local = threading.local()

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

    def _on_duration(self, event: str, seconds: float, **kwargs: Any) -> None:
        if event != _COMPILE_EVENT:
            return
        fun_name = str(kwargs.get("fun_name", "?"))
        record = CompileEvent(fun_name, float(seconds), self._pop_pending(fun_name))
        errors = []
        for sink in list(self._sinks):
            try:
                sink._record(record)
            except CompileBudgetExceeded as err:  # raised by lifetime budgets
                errors.append(err)
        if errors:
            raise errors[0]

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
            if not self._flag_before:
                jax.config.update("jax_explain_cache_misses", True)
        self._explain_users += 1

    def _release_explanations(self) -> None:
        self._explain_users -= 1
        if self._explain_users == 0:
            logging.getLogger(_EXPLAIN_LOGGER).removeFilter(self._filter)
            if not self._flag_before:
                jax.config.update("jax_explain_cache_misses", False)
            self._flag_before = None

    @property
    def user_wants_explanations(self) -> bool:
        """True when the user had ``jax_explain_cache_misses`` on before us."""
        return bool(self._flag_before)

    def _pending(self) -> list[CacheMiss]:
        pending = getattr(self._local, "pending", None)
        if pending is None:
            pending = self._local.pending = []
        return pending

    def on_explanation(self, miss: CacheMiss) -> None:
        pending = self._pending()
        pending.append(miss)
        del pending[:-_MAX_PENDING]
        for sink in list(self._explain_sinks):
            sink._record(miss)

    def _pop_pending(self, fun_name: str) -> CacheMiss | None:
        pending = self._pending()
        inner = fun_name[4:-1] if fun_name.startswith("jit(") and fun_name.endswith(")") else fun_name
        for i in range(len(pending) - 1, -1, -1):
            if pending[i].function == inner:
                miss = pending[i]
                del pending[i]
                return miss
        return None


class _CaptureFilter(logging.Filter):
    """Captures JAX's cache-miss explanations; hides them unless the user asked for them."""

    def __init__(self, hub: _Hub) -> None:
        super().__init__()
        self._hub = hub

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if not message.startswith(_MISS_HEADER):
            return True
        self._hub.on_explanation(parse_cache_miss(message))
        return self._hub.user_wants_explanations


_HUB = _Hub()


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


def _target_of(name: str | Callable | None) -> tuple[str | None, str | None]:
    """(function name, 'file:line' of its definition) for a name filter."""
    if name is None:
        return None, None
    if isinstance(name, str):
        if not name:
            raise ValueError("`name` must be a non-empty function name or a function, got ''")
        return name, None
    if callable(name):
        fn = inspect.unwrap(name)
        fname = getattr(fn, "__name__", None)
        code = getattr(fn, "__code__", None)
        if fname is None:
            raise TypeError(f"`name` must be a str or a function with a __name__, got {name!r}")
        loc = f"{code.co_filename}:{code.co_firstlineno}" if code is not None else None
        return fname, loc
    raise TypeError(f"`name` must be None, a function name (str) or a function, got {type(name).__name__}")


class CompileCounter:
    """Context manager counting backend compilations inside its block.

    Args:
      name: ``None`` counts every compilation (eager operations included, so
        a counter around a training loop sees exactly what the loop costs);
        a string ``"f"`` counts only ``jit(f)``; a function counts only
        compiles of that function (matched by name and, when JAX explains
        the miss, by where it is defined).
      explain: capture JAX's cache-miss explanation for each compile
        (default ``True``; the explanations are not printed).

    Attributes:
      count: number of compilations seen so far.
      events: ``[(fun_name, seconds), ...]`` in order.
      records: the same as :class:`CompileEvent` objects with explanations.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> def f(x): return x + 1
        >>> jf = jax.jit(f)
        >>> with CompileCounter("f") as c:
        ...     _ = jf(jnp.ones(2)); _ = jf(jnp.ones(2))
        >>> c.count, c.events[0][0]
        (1, 'jit(f)')
    """

    def __init__(self, name: str | Callable | None = None, *, explain: bool = True) -> None:
        self._name, self._defined_at = _target_of(name)
        self._explain = bool(explain)
        self.records: list[CompileEvent] = []
        self._active = False

    @property
    def count(self) -> int:
        return len(self.records)

    @property
    def events(self) -> list[tuple[str, float]]:
        return [(r.fun_name, r.seconds) for r in self.records]

    @property
    def seconds(self) -> float:
        """Total backend compile time seen."""
        return sum(r.seconds for r in self.records)

    def _matches(self, record: CompileEvent) -> bool:
        if self._name is None:
            return True
        if record.fun_name not in (f"jit({self._name})", self._name):
            return False
        miss = record.explanation
        if self._defined_at and miss is not None and miss.defined_at:
            return _same_location(miss.defined_at, self._defined_at)
        return True

    def _record(self, record: CompileEvent) -> None:
        if self._matches(record):
            self.records.append(record)

    def __enter__(self) -> CompileCounter:
        if self._active:
            raise RuntimeError("this CompileCounter is already active; create a new one per block")
        self.records = []
        self._active = True
        _HUB.add_sink(self, self._explain)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        _HUB.remove_sink(self, self._explain)
        self._active = False
        return False

    def report(self) -> str:
        """A multi-line listing of every compile with its reason."""
        if not self.records:
            return "no compilations"
        return "\n".join(f"  #{i} {r.describe()}" for i, r in enumerate(self.records, 1))

    def __repr__(self) -> str:
        target = f" name={self._name!r}" if self._name else ""
        return f"<{type(self).__name__}{target} count={self.count}>"


def _same_location(a: str, b: str) -> bool:
    """Whether two ``file:line`` locations are the same definition."""
    return a == b


def _check_budget_args(max_compiles: Any, on_exceed: Any) -> None:
    if isinstance(max_compiles, bool) or not isinstance(max_compiles, int):
        raise TypeError(f"`max_compiles` must be a non-negative int, got {max_compiles!r}")
    if max_compiles < 0:
        raise ValueError(f"`max_compiles` must be >= 0, got {max_compiles}")
    if on_exceed not in ("raise", "warn"):
        raise ValueError(f"`on_exceed` must be 'raise' or 'warn', got {on_exceed!r}")


def _budget_message(max_compiles: int, records: list[CompileEvent], target: str | None) -> str:
    scope = f" for `{target}`" if target else ""
    lines = [f"compile budget exceeded{scope}: {len(records)} compilations, budget {max_compiles}"]
    for i, record in enumerate(records, 1):
        marker = "  " if i <= max_compiles else "! "
        site = record.explanation.call_site if record.explanation else None
        where = f"  [called at {site}]" if site else ""
        lines.append(f"{marker}#{i} {record.describe()}{where}")
    return "\n".join(lines)


class CompileBudget(CompileCounter):
    """A :class:`CompileCounter` that fails when its block compiles too often.

    On exit, if more than ``max_compiles`` compilations happened, raises
    :class:`CompileBudgetExceeded` (``on_exceed="raise"``) or emits a
    ``RuntimeWarning`` (``on_exceed="warn"``). The message lists every compile
    with its duration and JAX's cache-miss explanation. If the block itself
    raised, its exception propagates and no budget error is stacked on top.

    Args:
      max_compiles: the budget, an int >= 0.
      name: as for :class:`CompileCounter`.
      on_exceed: ``"raise"`` or ``"warn"``.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> step = jax.jit(lambda x, lr: x - lr * x)
        >>> x = jnp.ones(3)
        >>> with CompileBudget(1):
        ...     for lr in (0.1, 0.2, 0.3):   # Python floats: one program
        ...         x = step(x, lr)
    """

    def __init__(
        self,
        max_compiles: int,
        name: str | Callable | None = None,
        on_exceed: OnExceed = "raise",
    ) -> None:
        _check_budget_args(max_compiles, on_exceed)
        super().__init__(name)
        self.max_compiles = max_compiles
        self.on_exceed = on_exceed

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        super().__exit__(exc_type, exc, tb)
        if exc_type is not None or self.count <= self.max_compiles:
            return False
        message = _budget_message(self.max_compiles, self.records, self._name)
        if self.on_exceed == "warn":
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return False
        raise CompileBudgetExceeded(message, self.max_compiles, list(self.records))


class _LifetimeBudget(CompileCounter):
    """The counter behind :func:`compile_budget`: always listening, checks at each compile."""

    def __init__(self, max_compiles: int, fn: Callable, on_exceed: OnExceed) -> None:
        super().__init__(fn)
        self.max_compiles = max_compiles
        self.on_exceed = on_exceed
        self._active = True

    def _record(self, record: CompileEvent) -> None:
        if not self._matches(record):
            return
        self.records.append(record)
        if self.count > self.max_compiles:
            message = _budget_message(self.max_compiles, self.records, self._name)
            if self.on_exceed == "warn":
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            else:
                raise CompileBudgetExceeded(message, self.max_compiles, list(self.records))

    def reset(self) -> None:
        """Forget the compiles counted so far."""
        self.records = []

    def __enter__(self) -> CompileCounter:
        raise TypeError("a compile_budget counter is always active; use CompileBudget as a context manager")


def compile_budget(max_compiles: int, on_exceed: OnExceed = "raise") -> Callable[[Callable], Any]:
    """Decorator: budget the compilations of one jitted function over its lifetime.

    The decorated function is jitted if it is not already, and returned
    unchanged (no wrapper, so calls cost exactly what the jitted call costs).
    Compilations are counted by a process-wide listener; the one that goes
    over budget raises :class:`CompileBudgetExceeded` from the call that
    triggered it (before the new program runs, so donated inputs are
    untouched), or warns with ``on_exceed="warn"``. ``fn.budget`` is the
    counter (``.count``, ``.records``, ``.report()``, ``.reset()``).

    Args:
      max_compiles: the budget, an int >= 0.
      on_exceed: ``"raise"`` or ``"warn"``.

    Example:
        >>> import jax.numpy as jnp
        >>> @compile_budget(1)
        ... def double(x):
        ...     return 2 * x
        >>> _ = double(jnp.ones(3)); _ = double(jnp.zeros(3))
        >>> double.budget.count
        1
    """
    _check_budget_args(max_compiles, on_exceed)

    def decorate(fn: Callable) -> Any:
        if not callable(fn):
            raise TypeError(f"compile_budget decorates a function, got {type(fn).__name__}")
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        budget = _LifetimeBudget(max_compiles, jitted, on_exceed)
        jitted.budget = budget
        _HUB.add_sink(budget, True)
        weakref.finalize(jitted, _HUB.remove_sink, budget, True)
        return jitted

    return decorate


class explain_recompiles:  # noqa: N801 - used like a function (a context manager)
    """Context manager collecting JAX's cache-miss explanations as records.

    Yields a list that fills with :class:`CacheMiss` records (function,
    kind, reasons, raw text) for every tracing-cache miss in the block.
    Nothing is printed; ``jax_explain_cache_misses`` and the logger are
    restored on exit, also when the block raises.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> def g(x): return x * 2
        >>> jg = jax.jit(g)
        >>> with explain_recompiles() as misses:
        ...     _ = jg(jnp.ones(3)); _ = jg(jnp.ones(5))
        >>> [m.kind for m in misses]
        ['new_function', 'types']
    """

    def __init__(self) -> None:
        self.records: list[CacheMiss] = []

    def _record(self, miss: CacheMiss) -> None:
        self.records.append(miss)

    def __enter__(self) -> list[CacheMiss]:
        _HUB.add_explain_sink(self)
        return self.records

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        _HUB.remove_explain_sink(self)
        return False


# --------------------------------------------------------------------------
# stage_report
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class StageReport:
    """Costs of each stage of ``jit``: trace, lower, compile; and program figures.

    Times are milliseconds; memory figures are bytes from
    ``compiled.memory_analysis()`` (``None`` where the backend gives none);
    ``flops`` from ``compiled.cost_analysis()``.
    """

    trace_ms: float
    lower_ms: float
    compile_ms: float
    jaxpr_eqns: int
    jaxpr_eqns_total: int
    stablehlo_lines: int
    argument_bytes: int | None
    output_bytes: int | None
    temp_bytes: int | None
    alias_bytes: int | None
    generated_code_bytes: int | None
    peak_bytes: int | None
    flops: float | None
    bytes_accessed: float | None

    def table(self) -> str:
        """Render as aligned ``name  value`` lines."""
        rows = dataclasses.asdict(self)
        width = max(map(len, rows))
        return "\n".join(f"{k:<{width}}  {_fmt(v)}" for k, v in rows.items())


def _fmt(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 1e6 else f"{value:.4g}"
    return str(value)


def count_eqns(jaxpr: Any) -> int:
    """Number of equations in a jaxpr, counting nested bodies recursively.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> count_eqns(jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0).jaxpr)
        2
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return sum(1 + sum(count_eqns(sub) for sub in jax.extend.core.jaxprs_in_params(eqn.params)) for eqn in jaxpr.eqns)


def stage_report(jitted: Callable, *args: Any, **kwargs: Any) -> StageReport:
    """Trace, lower and compile ``jitted(*args, **kwargs)`` and report each stage.

    Args:
      jitted: a ``jax.jit`` function (a plain function is jitted first).
      *args, **kwargs: example arguments: arrays or ``jax.ShapeDtypeStruct``.

    Returns:
      A :class:`StageReport`. The program is compiled (one compilation) but
      never run.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> r = stage_report(jax.jit(lambda a, b: a @ b), jnp.ones((64, 64)), jnp.ones((64, 64)))
        >>> r.jaxpr_eqns, r.flops >= 2 * 64**3
        (1, True)
    """
    if not callable(jitted):
        raise TypeError(f"`jitted` must be a function, got {type(jitted).__name__}")
    if not hasattr(jitted, "trace"):
        jitted = jax.jit(jitted)
    t0 = time.perf_counter()
    traced = jitted.trace(*args, **kwargs)
    t1 = time.perf_counter()
    lowered = traced.lower()
    t2 = time.perf_counter()
    compiled = lowered.compile()
    t3 = time.perf_counter()
    closed = traced.jaxpr
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else None

    def mem_field(field: str) -> int | None:
        value = getattr(mem, field, None) if mem is not None else None
        return int(value) if value is not None else None

    return StageReport(
        trace_ms=1e3 * (t1 - t0),
        lower_ms=1e3 * (t2 - t1),
        compile_ms=1e3 * (t3 - t2),
        jaxpr_eqns=len(closed.jaxpr.eqns),
        jaxpr_eqns_total=count_eqns(closed.jaxpr),
        stablehlo_lines=lowered.as_text().count("\n") + 1,
        argument_bytes=mem_field("argument_size_in_bytes"),
        output_bytes=mem_field("output_size_in_bytes"),
        temp_bytes=mem_field("temp_size_in_bytes"),
        alias_bytes=mem_field("alias_size_in_bytes"),
        generated_code_bytes=mem_field("generated_code_size_in_bytes"),
        peak_bytes=mem_field("peak_memory_in_bytes"),
        flops=float(cost["flops"]) if cost and "flops" in cost else None,
        bytes_accessed=float(cost["bytes accessed"]) if cost and "bytes accessed" in cost else None,
    )

"""Counting and budgeting compilations: of a block, or of one target program.

A *target* is a function name, a jitted function, or any object that owns one through a
``.jitted`` attribute (``TrainStep``, ``TrainEpoch``, ``BucketedFunction``, a
`compile_budget`-decorated function). A target counts exactly the compilations of its
program, identified the way JAX identifies functions: name and place of definition.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Literal

import jax
import numpy as np

from jaxwise._errors import JaxwiseError
from jaxwise._shared._checks import check_bool, check_choice, check_int
from jaxwise.compilation._hub import HUB, CompileEvent

__all__ = ["CompileBudget", "CompileBudgetExceeded", "CompileCounter", "compile_budget"]

OnExceed = Literal["raise", "warn"]


class CompileBudgetExceeded(JaxwiseError, RuntimeError):
    """Raised when a block or function compiled more often than budgeted (or, with ``exact``, less).

    Args:
        message: the report: every compile with its reason.
        max_compiles: the budget.
        events: the compiles counted.

    Attributes:
        max_compiles: the budget.
        events: every [`CompileEvent`][jaxwise.compilation.CompileEvent] counted, in order.
    """

    __module__ = "jaxwise.compilation"

    def __init__(self, message: str, max_compiles: int, events: list[CompileEvent]):
        super().__init__(message)
        self.max_compiles = max_compiles
        self.events = events


@dataclasses.dataclass(frozen=True)
class _Target:
    """What a counter counts: a name, one function's ``"name at file:line"``, or, for a
    jitted target, the exact function objects it traces (``fun_ids``: the wrapped function
    and those it wraps in turn, ``functools.wraps``' ``__wrapped__`` chain)."""

    name: str
    source: str | None
    fun_ids: frozenset[int] = frozenset()

    def matches(self, event: CompileEvent) -> bool:
        if self.fun_ids and event.function_id is not None:
            return event.function_id in self.fun_ids
        if self.source is not None and event.source is not None:
            return event.source == self.source
        return event.fun_name in (f"jit({self.name})", self.name) or event.function == self.name


def _source_of(fn: Any) -> tuple[str, str | None]:
    """(name, "name at file:line") the way JAX names a traced function."""
    fn = inspect.unwrap(fn)
    while isinstance(fn, functools.partial):
        fn = inspect.unwrap(fn.func)
    fn = getattr(fn, "__func__", fn)  # a bound method: its function
    name = getattr(fn, "__name__", None)
    code = getattr(fn, "__code__", None)
    if name is None:
        raise TypeError(
            f"`target` must be a name, a function or an object with `.jitted`, got "
            f"{type(fn).__name__}"
        )
    source = f"{name} at {code.co_filename}:{code.co_firstlineno}" if code is not None else None
    return name, source


def _wrapped_chain(fn: Any) -> list[Any]:
    """``fn`` and every function it wraps (``__wrapped__``), outermost first."""
    chain: list[Any] = []
    while fn is not None and all(fn is not seen for seen in chain):
        chain.append(fn)
        fn = getattr(fn, "__wrapped__", None)
    return chain


def resolve_target(target: Any) -> _Target | None:
    """Turn a counter's ``target`` argument into a `_Target` (``None``: everything)."""
    if target is None:
        return None
    if isinstance(target, str):
        if not target:
            raise ValueError("`target` must be a non-empty function name, got ''")
        return _Target(target, None)
    jitted = getattr(target, "jitted", None)
    if jitted is not None and jitted is not target:
        return resolve_target(jitted)
    if callable(target):
        name, source = _source_of(target)
        # A jitted function traces exactly the object it wraps: identify its programs by it
        # (the target keeps that object alive, so its id cannot be reused meanwhile).
        wrapped = getattr(target, "__wrapped__", None) if hasattr(target, "lower") else None
        return _Target(name, source, frozenset(map(id, _wrapped_chain(wrapped))))
    raise TypeError(
        f"`target` must be None, a function name (str), a jitted function or an object "
        f"with a `.jitted` attribute, got {type(target).__name__}"
    )


class CompileCounter:
    """Context manager counting backend compilations inside its block.

    Args:
        target: ``None`` counts every compilation (eager operations included unless
            ``include_eager=False``); a string ``"f"`` counts programs named ``jit(f)``; a
            function, a jitted function, or any object with a ``.jitted`` attribute
            (``TrainStep``, ``TrainEpoch``, ``BucketedFunction``, a
            [`compile_budget`][jaxwise.compilation.compile_budget]-decorated function)
            counts exactly that program's compiles.
        explain: capture the structured cache-miss explanation of each compile (default
            ``True``; nothing is printed).
        include_eager: count eager operations outside ``jit`` (programs defined inside JAX,
            such as ``jnp.ones(3)``). Only meaningful without a target.

    Attributes:
        records: every compile counted, as
            [`CompileEvent`][jaxwise.compilation.CompileEvent] objects with explanations.
        others: programs that compiled in the block but did not match the target.

    Raises:
        TypeError: ``target`` is not a name, function or object with ``.jitted``, or a flag
            is not a bool.
        ValueError: ``target`` is an empty string.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> def f(x): return x + 1
        >>> jf = jax.jit(f)
        >>> with CompileCounter(jf) as c:
        ...     _ = jf(jnp.ones(2)); _ = jf(jnp.ones(2))
        >>> c.count, c.records[0].fun_name
        (1, 'jit(f)')
    """

    def __init__(
        self,
        target: Any = None,
        *,
        explain: bool = True,
        include_eager: bool = True,
    ) -> None:
        check_bool(explain, "explain")
        check_bool(include_eager, "include_eager")
        self._target = resolve_target(target)
        self._explain = bool(explain)
        self._include_eager = bool(include_eager)
        self.records: list[CompileEvent] = []
        self.others: list[CompileEvent] = []
        self._active = False

    @property
    def count(self) -> int:
        """The number of compilations counted so far."""
        return len(self.records)

    @property
    def events(self) -> list[tuple[str, float]]:
        """``[(fun_name, seconds), ...]`` of the compilations counted, in order."""
        return [(r.fun_name, r.seconds) for r in self.records]

    @property
    def seconds(self) -> float:
        """Total backend compile time seen."""
        return sum(r.seconds for r in self.records)

    @property
    def target_name(self) -> str | None:
        """The target's function name, if the counter has a target."""
        return self._target.name if self._target else None

    def _matches(self, record: CompileEvent) -> bool:
        if self._target is None:
            return self._include_eager or not record.internal
        return self._target.matches(record)

    def record(self, record: CompileEvent) -> None:
        """Called by the listener for every compilation while the counter is active.

        Args:
            record: the compilation: counted when it matches the target, else kept in
                ``others``.
        """
        if self._matches(record):
            self.records.append(record)
        else:
            self.others.append(record)

    def __enter__(self) -> CompileCounter:
        if self._active:
            raise RuntimeError("this CompileCounter is already active; create a new one per block")
        self.records, self.others = [], []
        self._active = True
        HUB.add_sink(self, self._explain)
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        HUB.remove_sink(self, self._explain)
        self._active = False
        return False

    def report(self) -> str:
        """A multi-line listing of every compile with its reason.

        Returns:
            One line per compile (``"no compilations"`` when there was none).
        """
        if not self.records:
            return "no compilations"
        return "\n".join(f"  #{i} {r.describe()}" for i, r in enumerate(self.records, 1))

    def __repr__(self) -> str:
        target = f" target={self._target.name!r}" if self._target else ""
        return f"<{type(self).__name__}{target} count={self.count}>"


def _check_budget_args(max_compiles: Any, on_exceed: Any) -> int:
    value = check_int(max_compiles, "max_compiles", min_value=0)
    check_choice(on_exceed, "on_exceed", ("raise", "warn"))
    return value


def _budget_message(
    max_compiles: int, records: list[CompileEvent], target: str | None, exact: bool
) -> str:
    scope = f" for `{target}`" if target else ""
    wanted = f"exactly {max_compiles}" if exact else f"budget {max_compiles}"
    verb = (
        "compile count wrong"
        if exact and len(records) < max_compiles
        else "compile budget exceeded"
    )
    lines = [f"{verb}{scope}: {len(records)} compilations, {wanted}"]
    for i, record in enumerate(records, 1):
        marker = "  " if i <= max_compiles else "! "
        site = record.explanation.call_site if record.explanation else None
        where = f"  [called at {site}]" if site else ""
        lines.append(f"{marker}#{i} {record.describe()}{where}")
    return "\n".join(lines)


def _nothing_matched_message(target: str, others: list[CompileEvent]) -> str:
    names = sorted({r.fun_name for r in others})
    return (
        f"CompileBudget for `{target}` counted 0 compilations while {len(others)} other "
        f"program(s) compiled in the block: {', '.join(names)}. Is the target right (a "
        "misspelled name, or a wrapper that compiles under another name)?"
    )


class CompileBudget(CompileCounter):
    """A `CompileCounter` that fails when its block compiles too often.

    On exit, if more than ``max_compiles`` compilations were counted (or, with
    ``exact=True``, any other number), raises
    [`CompileBudgetExceeded`][jaxwise.compilation.CompileBudgetExceeded]
    (``on_exceed="raise"``) or emits a ``RuntimeWarning`` (``on_exceed="warn"``). The message
    lists every compile with its duration and its cache-miss explanation. A budget with a
    target that counted nothing while other programs compiled warns (``RuntimeWarning``),
    naming them. If the block itself raised, its exception propagates and nothing is stacked
    on top.

    Args:
        max_compiles: the budget, an int >= 0.
        target: as for [`CompileCounter`][jaxwise.compilation.CompileCounter].
        on_exceed: ``"raise"`` or ``"warn"``.
        exact: require exactly ``max_compiles`` compilations.
        include_eager: as for [`CompileCounter`][jaxwise.compilation.CompileCounter].

    Raises:
        TypeError: a wrong argument type (as for ``CompileCounter``).
        ValueError: ``max_compiles < 0`` or an unknown ``on_exceed``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> step = jax.jit(lambda x, lr: x - lr * x)
        >>> x = jnp.ones(3)
        >>> with CompileBudget(1, step, exact=True):
        ...     for lr in (0.1, 0.2, 0.3):   # Python floats: one program
        ...         x = step(x, lr)
    """

    def __init__(
        self,
        max_compiles: int | np.integer,
        target: Any = None,
        on_exceed: OnExceed = "raise",
        *,
        exact: bool = False,
        include_eager: bool = True,
    ) -> None:
        self.max_compiles = _check_budget_args(max_compiles, on_exceed)
        check_bool(exact, "exact")
        super().__init__(target, include_eager=include_eager)
        self.on_exceed = on_exceed
        self.exact = bool(exact)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> Literal[False]:
        super().__exit__(exc_type, exc, tb)
        if exc_type is not None:
            return False
        if self._target is not None and self.count == 0 and self.others:
            warnings.warn(
                _nothing_matched_message(self._target.name, self.others),
                RuntimeWarning,
                stacklevel=2,
            )
        over = self.count > self.max_compiles
        if not over and not (self.exact and self.count != self.max_compiles):
            return False
        message = _budget_message(self.max_compiles, self.records, self.target_name, self.exact)
        if self.on_exceed == "warn":
            warnings.warn(message, RuntimeWarning, stacklevel=2)
            return False
        raise CompileBudgetExceeded(message, self.max_compiles, list(self.records))


class _LifetimeBudget(CompileCounter):
    """The counter behind `compile_budget`: always listening, checks at each compile."""

    def __init__(self, max_compiles: int, fn: Callable[..., Any], on_exceed: OnExceed) -> None:
        super().__init__(fn)
        self.max_compiles = max_compiles
        self.on_exceed = on_exceed
        self._active = True

    def record(self, record: CompileEvent) -> None:
        if not self._matches(record):
            return
        self.records.append(record)
        if self.count > self.max_compiles:
            message = _budget_message(self.max_compiles, self.records, self.target_name, False)
            if self.on_exceed == "warn":
                warnings.warn(message, RuntimeWarning, stacklevel=2)
            else:
                raise CompileBudgetExceeded(message, self.max_compiles, list(self.records))

    def reset(self) -> None:
        """Forget the compiles counted so far."""
        self.records = []

    def __enter__(self) -> CompileCounter:
        raise TypeError(
            "a compile_budget counter is always active; use CompileBudget as a context manager"
        )


def compile_budget(
    max_compiles: int | np.integer, on_exceed: OnExceed = "raise"
) -> Callable[[Callable[..., Any]], Any]:
    """Decorator: budget the compilations of one jitted function over its lifetime.

    The decorated function is jitted if it is not already, and returned unchanged (no
    wrapper, so calls cost exactly what the jitted call costs). Compilations are counted by a
    process-wide listener; the one that goes over budget raises
    [`CompileBudgetExceeded`][jaxwise.compilation.CompileBudgetExceeded] from the call that
    triggered it (before the new program runs, so donated inputs are untouched), or warns
    with ``on_exceed="warn"``. ``fn.budget`` is the counter (``.count``, ``.records``,
    ``.report()``, ``.reset()``); ``fn.jitted`` is ``fn`` itself, so the function is also a
    target for [`CompileCounter`][jaxwise.compilation.CompileCounter].

    Args:
        max_compiles: the budget, an int >= 0.
        on_exceed: ``"raise"`` or ``"warn"``.

    Returns:
        The decorator: it takes a function and returns it jitted, with ``.budget`` and
            ``.jitted`` attached (it raises ``TypeError`` for a non-callable).

    Raises:
        TypeError: ``max_compiles`` is not an int.
        ValueError: ``max_compiles < 0`` or an unknown ``on_exceed``.

    Examples:
        >>> import jax.numpy as jnp
        >>> @compile_budget(1)
        ... def double(x):
        ...     return 2 * x
        >>> _ = double(jnp.ones(3)); _ = double(jnp.zeros(3))
        >>> double.budget.count
        1
    """
    max_compiles = _check_budget_args(max_compiles, on_exceed)

    def decorate(fn: Callable[..., Any]) -> Any:
        if not callable(fn):
            raise TypeError(f"compile_budget decorates a function, got {type(fn).__name__}")
        jitted: Any = fn if hasattr(fn, "lower") else jax.jit(fn)
        budget = _LifetimeBudget(max_compiles, jitted, on_exceed)
        jitted.budget = budget
        jitted.jitted = weakref.proxy(jitted)  # the protocol's `.jitted`, without a ref cycle
        HUB.add_sink(budget, True)
        weakref.finalize(jitted, HUB.remove_sink, budget, True)
        return jitted

    return decorate

"""Count, budget and explain real XLA compilations.

Every backend compilation JAX performs is reported through ``jax.monitoring`` (event
``/jax/core/compile/backend_compile_duration``).
[`CompileCounter`][jaxwise.compilation.CompileCounter] listens to those events;
[`CompileBudget`][jaxwise.compilation.CompileBudget] turns a count into an assertion;
[`compile_budget`][jaxwise.compilation.compile_budget] does the same for one jitted function over
its lifetime. Counters take a *target* (a name, a jitted function, or any jaxwise object with a
``.jitted`` attribute) and then count exactly that program. Each recompile carries a structured
[`CacheMiss`][jaxwise.compilation.CacheMiss] (``kind``, ``argument``, ``old``, ``new``) computed
from the tracing-cache keys JAX compares, so a budget failure says exactly *what* changed:

    compile budget exceeded for `f`: 2 compilations, budget 1
      #1 jit(f)   14.2 ms  first compile of `f` (defined at model.py:12)
    ! #2 jit(f)    9.8 ms  static argument `n`: 2 → 3

Modules: ``_explain`` (cache-miss explanations), ``_hub`` (the process-wide listener),
``_counter`` (counters, budgets, targets) and ``_stage`` (stage reports); JAX's cache keys are
read in ``jaxwise._shared._jax``, the one place that reads JAX internals.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> f = jax.jit(lambda x: 2 * x)
    >>> a, b = jnp.ones(3), jnp.ones(4)
    >>> with CompileCounter(f) as counter:
    ...     _ = f(a); _ = f(a); _ = f(b)
    >>> counter.count, counter.records[1].explanation.kind
    (2, 'shape')
"""

import typing as _typing

from jaxwise.compilation._counter import CompileBudget as CompileBudget
from jaxwise.compilation._counter import CompileBudgetExceeded as CompileBudgetExceeded
from jaxwise.compilation._counter import CompileCounter as CompileCounter
from jaxwise.compilation._counter import compile_budget as compile_budget
from jaxwise.compilation._explain import KINDS as KINDS
from jaxwise.compilation._explain import CacheMiss as CacheMiss
from jaxwise.compilation._explain import Difference as Difference
from jaxwise.compilation._explain import parse_cache_miss as parse_cache_miss
from jaxwise.compilation._hub import CompileEvent as CompileEvent
from jaxwise.compilation._hub import explain_recompiles as explain_recompiles
from jaxwise.compilation._hub import subscribe as subscribe
from jaxwise.compilation._stage import StageReport as StageReport
from jaxwise.compilation._stage import count_eqns as count_eqns
from jaxwise.compilation._stage import stage_report as stage_report

if _typing.TYPE_CHECKING:
    from jaxwise.compilation._convolution import canonical_convolutions as canonical_convolutions
    from jaxwise.compilation._evaluate import EquationHook as EquationHook
    from jaxwise.compilation._evaluate import evaluate_equation as evaluate_equation
    from jaxwise.compilation._evaluate import evaluate_jaxpr as evaluate_jaxpr

# Imported on first use: they import `jax.extend`, which loads Pallas (~0.1 s of start-up
# that `jaxwise watch`, which counts compiles only, would pay for nothing).
_LAZY = {
    "canonical_convolutions": "jaxwise.compilation._convolution",
    "EquationHook": "jaxwise.compilation._evaluate",
    "evaluate_equation": "jaxwise.compilation._evaluate",
    "evaluate_jaxpr": "jaxwise.compilation._evaluate",
}


def __getattr__(name: str) -> _typing.Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "KINDS",
    "CacheMiss",
    "CompileBudget",
    "CompileBudgetExceeded",
    "CompileCounter",
    "CompileEvent",
    "Difference",
    "EquationHook",
    "StageReport",
    "canonical_convolutions",
    "compile_budget",
    "count_eqns",
    "evaluate_equation",
    "evaluate_jaxpr",
    "explain_recompiles",
    "parse_cache_miss",
    "stage_report",
    "subscribe",
]

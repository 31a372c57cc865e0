"""Overhead of ``@compile_budget`` vs the bare jitted call on a tiny function.

Target: ≤ 1.05×. ``compile_budget`` returns the jitted function itself and
counts compiles with a process-wide ``jax.monitoring`` listener, so a cached
call runs exactly the same code; we also show the cost of a ``CompileCounter``
block around every call for context.
"""

import jax
import jax.numpy as jnp
from common import QUICK, fmt_time, interleaved_times, main_guard, table, write_section

from jaxwise.compilation import CompileCounter, compile_budget


def tiny(x):
    return x * 2.0 + 1.0


def run() -> None:
    x = jnp.ones(8)
    bare = jax.jit(tiny)
    budgeted = compile_budget(1)(jax.jit(lambda x: x * 2.0 + 1.0))

    def with_counter():
        with CompileCounter():
            return bare(x)

    def with_target():
        with CompileCounter(bare):
            return bare(x)

    number = 2000 if QUICK else 20000
    t_bare, t_budget, t_counter, t_target = interleaved_times(
        [lambda: bare(x), lambda: budgeted(x), with_counter, with_target], repeat=9, number=number
    )
    rows = [
        ["bare `jax.jit` call", fmt_time(t_bare), "1.00", ""],
        ["`@compile_budget(1)` call", fmt_time(t_budget), f"{t_budget / t_bare:.3f}", "≤ 1.05"],
        [
            "`with CompileCounter():` around each call",
            fmt_time(t_counter),
            f"{t_counter / t_bare:.2f}",
            "context",
        ],
        [
            "`with CompileCounter(bare):` (a target) around each call",
            fmt_time(t_target),
            f"{t_target / t_bare:.2f}",
            "context",
        ],
    ]
    assert budgeted.budget.count == 1
    write_section(
        "compile_budget",
        "Compile budget overhead (tiny jitted function, 8 floats)",
        table(["call", "median time", "ratio vs bare", "target"], rows)
        + "\n\nThe decorator adds no wrapper: a budgeted call *is* the jitted call.",
    )


if __name__ == "__main__":
    main_guard(run)

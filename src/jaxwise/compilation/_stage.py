"""What each stage of ``jit`` costs: trace, lower, compile, and the program's size and memory."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax

from jaxwise._shared._checks import check_callable

__all__ = ["StageReport", "count_eqns", "stage_report"]

# (field, label, unit) in display order.
_ROWS = (
    ("trace_ms", "trace", "ms"),
    ("lower_ms", "lower", "ms"),
    ("compile_ms", "compile", "ms"),
    ("jaxpr_eqns", "jaxpr equations (top level)", ""),
    ("jaxpr_eqns_total", "jaxpr equations (all, nested)", ""),
    ("stablehlo_lines", "StableHLO lines", ""),
    ("argument_bytes", "arguments", "bytes"),
    ("output_bytes", "outputs", "bytes"),
    ("temp_bytes", "temporaries", "bytes"),
    ("alias_bytes", "aliased (donated)", "bytes"),
    ("generated_code_bytes", "generated code", "bytes"),
    ("peak_bytes", "peak memory", "bytes"),
    ("flops", "flops", ""),
    ("bytes_accessed", "bytes accessed", "bytes"),
)


@dataclasses.dataclass(frozen=True)
class StageReport:
    """Costs of each stage of ``jit``: trace, lower, compile; and program figures.

    Times are milliseconds; memory figures are bytes from ``compiled.memory_analysis()``
    (``None`` where the backend gives none): the device's allocation sizes, so an accelerator's
    include its padding to tiles (a float32 scalar output is 4 bytes on a CPU, 512 on a TPU);
    ``flops`` from ``compiled.cost_analysis()``.
    ``str(report)`` (and so ``print(report)``) is a readable table.

    Attributes:
        trace_ms: tracing time (Python to jaxpr).
        lower_ms: lowering time (jaxpr to StableHLO).
        compile_ms: XLA compile time.
        jaxpr_eqns: equations at the top level of the jaxpr.
        jaxpr_eqns_total: equations including nested bodies (scan, cond, pjit, …).
        stablehlo_lines: lines of the StableHLO text.
        argument_bytes: memory of the arguments.
        output_bytes: memory of the outputs.
        temp_bytes: temporary memory of the program.
        alias_bytes: memory shared between arguments and outputs (donation).
        generated_code_bytes: size of the compiled code.
        peak_bytes: peak memory.
        flops: floating-point operations.
        bytes_accessed: bytes read and written.
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
        """The report as an aligned three-column table: stage / figure, value, unit.

        Returns:
            The table's text (``"n/a"`` for figures the backend does not give).
        """
        rows = [(label, _fmt(getattr(self, field), unit), unit) for field, label, unit in _ROWS]
        width = max(len(label) for label, _, _ in rows)
        value_width = max(len(value) for _, value, _ in rows)
        header = f"{'stage / figure':<{width}}  {'value':>{value_width}}  unit"
        lines = [header, "-" * len(header)]
        lines += [
            f"{label:<{width}}  {value:>{value_width}}  {unit}".rstrip()
            for label, value, unit in rows
        ]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _fmt(value: Any, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ms":
        return f"{value:.2f}"
    if isinstance(value, float):
        return f"{value:,.0f}" if value >= 1 or value == 0 else f"{value:.3g}"
    return f"{value:,}"


def _jaxprs_in_params(params: Any) -> Any:
    import jax.extend.core  # not at import: jax.extend loads Pallas (~20 ms of start-up)

    return jax.extend.core.jaxprs_in_params(params)


def count_eqns(jaxpr: Any) -> int:
    """Number of equations in a jaxpr, counting nested bodies recursively.

    Args:
        jaxpr: a ``jax.extend.core.Jaxpr`` or ``ClosedJaxpr`` (e.g. from
            ``jax.make_jaxpr(f)(x)``).

    Returns:
        The number of equations.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> count_eqns(jax.make_jaxpr(lambda x: jnp.sin(x) * 2)(1.0).jaxpr)
        2
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return sum(
        1 + sum(count_eqns(sub) for sub in _jaxprs_in_params(eqn.params)) for eqn in jaxpr.eqns
    )


def stage_report(jitted: Callable[..., Any], *args: Any, **kwargs: Any) -> StageReport:
    """Trace, lower and compile ``jitted(*args, **kwargs)`` and report each stage.

    Args:
        jitted: a ``jax.jit`` function (a plain function is jitted first), or an object with
            a ``.jitted`` attribute (``TrainStep``, ``BucketedFunction``, …).
        *args: example arguments: arrays or ``jax.ShapeDtypeStruct``.
        **kwargs: example keyword arguments.

    Returns:
        A [`StageReport`][jaxwise.compilation.StageReport]. The program is compiled (one
            compilation) but never run.

    Raises:
        TypeError: ``jitted`` is not callable.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> r = stage_report(jax.jit(lambda a, b: a @ b), jnp.ones((64, 64)), jnp.ones((64, 64)))
        >>> r.jaxpr_eqns, r.flops >= 2 * 64**3
        (1, True)
    """
    inner = getattr(jitted, "jitted", None)
    if inner is not None and not hasattr(jitted, "trace"):
        jitted = inner
    fn: Any = check_callable(jitted, "jitted")
    if not hasattr(fn, "trace"):
        fn = jax.jit(fn)
    t0 = time.perf_counter()
    traced = fn.trace(*args, **kwargs)
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

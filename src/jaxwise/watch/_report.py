"""What a watch found: per-function compiles and recompiles, NaNs, donations, transfers, time.

`WatchReport` is plain data: ``to_json()`` gives the strict JSON document (``"schema":
1``) and ``str()`` a text table. Why a function compiled is
[`compilation.CacheMiss`][jaxwise.compilation.CacheMiss], the one record of it everywhere.
Nothing here imports JAX.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jaxwise.compilation import CacheMiss

__all__ = [
    "FAIL_ON",
    "DonationFinding",
    "FunctionReport",
    "NanFinding",
    "NanStop",
    "TransferSite",
    "WatchReport",
]

SCHEMA = 1
FAIL_ON = ("recompile", "nan", "donation")


def miss_json(miss: CacheMiss, steady_state: bool) -> dict[str, Any]:
    """One compile's JSON fields in the watch report's schema (1).

    Args:
        miss: the compile's [`CacheMiss`][jaxwise.compilation.CacheMiss]; its ``call_site`` is
            the user's line that compiled.
        steady_state: the compile came after the function's warm-up.

    Returns:
        ``kind``, ``argument``, ``old``, ``new``, ``where`` and ``steady_state``.
    """
    return {
        "kind": miss.kind,
        "argument": miss.argument,
        "old": miss.old,
        "new": miss.new,
        "where": miss.call_site,
        "steady_state": steady_state,
    }


@dataclasses.dataclass(frozen=True)
class FunctionReport:
    """One jitted function (all the function objects jitted at one place of the user's code).

    Attributes:
        name: the Python function's name.
        where: ``"file.py:LINE"`` where it was jitted (for functions jitted before the watch
            started: where JAX says it is defined).
        calls: calls seen (``None`` for a function jitted before the watch started: its calls
            are not seen, only its compiles).
        compiles: backend compilations.
        compile_seconds: time spent tracing, lowering and compiling it.
        call_seconds: time spent inside its calls (dispatch, and compiling when it did; the
            device work itself runs asynchronously and shows up where the result is read);
            after a function's first 64 calls, one call in eight is timed and the others
            are counted at the timed calls' mean (their compiles at their own time).
        misses: one [`CacheMiss`][jaxwise.compilation.CacheMiss] per compile, in order; its
            ``call_site`` is the user's line that compiled (``None`` if unknown).
        warmup: compiles expected before a recompile counts as steady-state.
    """

    name: str
    where: str | None
    calls: int | None
    compiles: int
    compile_seconds: float
    call_seconds: float
    misses: tuple[CacheMiss, ...]
    warmup: int = 2

    @property
    def steady_state_recompiles(self) -> tuple[CacheMiss, ...]:
        """The compiles after warm-up: the recompiles to fix."""
        return self.misses[self.warmup :]

    def to_json(self) -> dict[str, Any]:
        """The JSON fields of the watch report's schema.

        Returns:
            A dict of JSON-ready values (no NaN or infinity).
        """
        return {
            "name": self.name,
            "where": self.where,
            "calls": self.calls,
            "compiles": self.compiles,
            "compile_seconds": _finite(self.compile_seconds),
            "misses": [miss_json(m, i >= self.warmup) for i, m in enumerate(self.misses)],
        }


@dataclasses.dataclass(frozen=True)
class NanFinding:
    """The first non-finite value a watched function produced, located.

    Attributes:
        function: the jitted function whose output was not finite.
        primitive: the primitive that created it (``"log"``, ``"div"``…; ``"argument"`` when an
            input was already non-finite; ``"unknown"`` when the replay could not reproduce it).
        phase: ``"forward"`` or ``"backward"``.
        where: ``"file.py:LINE"`` of the user's line that made it, if known.
        source: that line's text.
        call_site: ``"file.py:LINE"`` of the call of ``function`` that produced it.
    """

    function: str
    primitive: str
    phase: str
    where: str | None
    source: str
    call_site: str | None

    def to_json(self) -> dict[str, Any]:
        """The JSON fields of the watch report's schema.

        Returns:
            A dict of JSON-ready values (no NaN or infinity).
        """
        return {
            "function": self.function,
            "primitive": self.primitive,
            "phase": self.phase,
            "where": self.where,
        }

    def describe(self) -> str:
        """One line: the primitive, the phase, the user's line and the jitted function.

        Returns:
            The line.
        """
        at = f" at {self.where}" if self.where else ""
        line = f": {self.source}" if self.source else ""
        if self.primitive == "argument":
            return f"`{self.function}` was called with a non-finite argument{at}"
        return (
            f"`{self.primitive}` ({self.phase} pass){at}{line}  [in `{self.function}`, called at "
            f"{self.call_site or '?'}]"
        )


@dataclasses.dataclass(frozen=True)
class DonationFinding:
    """A donated buffer that could not be reused, or a jaxwise step's ``DonationError``.

    Attributes:
        function: the jitted function (or jaxwise step) it was donated to.
        argument: the argument and path inside it, e.g. ``"state.params['w']"``.
        cause: why the donation failed, and the fix.
        count: how many calls it happened on.
    """

    function: str
    argument: str
    cause: str
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        """The JSON fields of the watch report's schema.

        Returns:
            A dict of JSON-ready values (no NaN or infinity).
        """
        return {"function": self.function, "argument": self.argument, "cause": self.cause}


@dataclasses.dataclass(frozen=True)
class TransferSite:
    """Implicit host-to-device transfers made by the calls at one place of the user's code.

    Attributes:
        where: ``"file.py:LINE"`` of the calls.
        function: the jitted function called there.
        calls: calls at this place that transferred something.
        transfers: host values transferred (NumPy arrays and Python scalars), in all.
        bytes: their total size.
        arguments: the arguments that were host values, e.g. ``("batch[0]", "lr")``.
    """

    where: str | None
    function: str
    calls: int
    transfers: int
    bytes: int
    arguments: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The JSON fields of the watch report's schema.

        Returns:
            A dict of JSON-ready values (no NaN or infinity).
        """
        return {
            "where": self.where,
            "function": self.function,
            "calls": self.calls,
            "transfers": self.transfers,
            "bytes": self.bytes,
            "arguments": list(self.arguments),
        }


def _finite(x: float) -> float:
    return round(float(x), 6) if math.isfinite(x) else 0.0


@dataclasses.dataclass(frozen=True)
class WatchReport:
    """Everything a watch saw.

    Attributes:
        functions: one `FunctionReport` per jitted function, most compile time first.
        nans: the located non-finite values (with ``nans`` checking on).
        donations: the failed donations.
        transfers: implicit host-to-device transfers per call site (``None`` unless
            ``transfers=True``).
        seconds_total: wall time of the watched block.
        seconds_compiling: time spent tracing, lowering and compiling, every program included.
        exit_code: the exit code of a watched script (``None`` for a block).
        stopped: the block was stopped at a NaN (``nans="stop"``).
        warmup: compiles per function before a recompile counts as steady-state.
        errors: checks the watch itself could not complete (the program ran on regardless).
        notes: what the watch did not check, and why.
    """

    functions: tuple[FunctionReport, ...]
    nans: tuple[NanFinding, ...]
    donations: tuple[DonationFinding, ...]
    transfers: tuple[TransferSite, ...] | None
    seconds_total: float
    seconds_compiling: float
    exit_code: int | None = None
    stopped: bool = False
    warmup: int = 2
    errors: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def steady_state_recompiles(self) -> tuple[tuple[FunctionReport, CacheMiss], ...]:
        """Every steady-state recompile, with its function."""
        return tuple((f, m) for f in self.functions for m in f.steady_state_recompiles)

    def triggered(self, fail_on: tuple[str, ...] | list[str]) -> tuple[str, ...]:
        """The conditions of ``fail_on`` (``"recompile"``, ``"nan"``, ``"donation"``) that hold.

        Args:
            fail_on: the conditions to test.

        Returns:
            Those of ``fail_on`` that the report shows, in ``fail_on``'s order.
        """
        found = {
            "recompile": bool(self.steady_state_recompiles),
            "nan": bool(self.nans),
            "donation": bool(self.donations),
        }
        return tuple(c for c in FAIL_ON if c in fail_on and found[c])

    def to_json(self) -> dict[str, Any]:
        """The strict JSON document (no NaN/Infinity), ``"schema": 1``.

        Returns:
            The document as a dict (``json.dumps`` writes it).
        """
        return {
            "schema": SCHEMA,
            "functions": [f.to_json() for f in self.functions],
            "nans": [n.to_json() for n in self.nans],
            "donations": [d.to_json() for d in self.donations],
            "transfers": None if self.transfers is None else [t.to_json() for t in self.transfers],
            "seconds": {
                "total": _finite(self.seconds_total),
                "compiling": _finite(self.seconds_compiling),
            },
            "exit_code": self.exit_code,
            "warmup": self.warmup,
            "errors": list(self.errors),
            "notes": list(self.notes),
        }

    def headline(self) -> str:
        """One line: time, compiles and what was flagged.

        Returns:
            The line.
        """
        compiles = sum(f.compiles for f in self.functions)
        share = self.seconds_compiling / self.seconds_total if self.seconds_total > 0 else 0.0
        flags = [
            f"{len(self.steady_state_recompiles)} steady-state recompile(s)",
            f"{len(self.nans)} NaN(s)",
            f"{len(self.donations)} failed donation(s)",
        ]
        return (
            f"{self.seconds_total:.2f} s total, {self.seconds_compiling:.2f} s compiling "
            f"({100 * share:.0f}%), {compiles} compile(s) of {len(self.functions)} function(s); "
            + ", ".join(flags)
        )

    def __str__(self) -> str:
        return render_text(self)


def _share(seconds: float, total: float) -> str:
    return f"{100 * seconds / total:.0f}%" if total > 0 else "-"


def function_rows(report: WatchReport) -> list[tuple[str, ...]]:
    """Table rows: function, jitted at, calls, compiles, compile s, share of time."""
    return [
        (
            f.name,
            f.where or "?",
            "?" if f.calls is None else str(f.calls),
            str(f.compiles)
            + (f" ({len(f.steady_state_recompiles)}!)" if f.steady_state_recompiles else ""),
            f"{f.compile_seconds:.2f}",
            _share(f.call_seconds, report.seconds_total),
        )
        for f in report.functions
    ]


def finding_lines(report: WatchReport) -> list[str]:
    """One line per flagged finding (steady-state recompiles, NaNs, donations, transfers)."""
    lines = []
    for function, miss in report.steady_state_recompiles:
        at = f" at {miss.call_site}" if miss.call_site else ""
        lines.append(f"steady-state recompile of `{function.name}`{at}: {miss.summary}")
    lines += [f"NaN: {n.describe()}" for n in report.nans]
    for d in report.donations:
        times = f" ({d.count} calls)" if d.count > 1 else ""
        lines.append(f"donation to `{d.function}` of `{d.argument}` failed{times}: {d.cause}")
    for t in report.transfers or ():
        args = ", ".join(t.arguments[:4]) + (" …" if len(t.arguments) > 4 else "")
        lines.append(
            f"transfers at {t.where or '?'} into `{t.function}`: {t.transfers} host value(s) in "
            f"{t.calls} call(s), {t.bytes / 1e6:.3g} MB ({args})"
        )
    return lines


def render_text(report: WatchReport) -> str:
    """The report as a plain-text table."""
    header = ("function", "jitted at", "calls", "compiles", "compile s", "time")
    rows = [header, *function_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = [f"jaxwise watch: {report.headline()}"]
    for row in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    findings = finding_lines(report)
    lines += [f"! {line}" for line in findings] or ["nothing flagged"]
    lines += [f"note: {n}" for n in report.notes]
    lines += [f"(watch could not finish a check: {e})" for e in report.errors]
    return "\n".join(lines)


class NanStop(BaseException):
    """Raised from a watched call whose output is not finite (``nans="stop"``).

    A ``BaseException`` (like ``KeyboardInterrupt``), so that the watched code's ``except
    Exception`` blocks do not swallow it; the `Watch` block ends there, silently.
    """

    def __init__(self, finding: NanFinding) -> None:
        super().__init__(finding.describe())
        self.finding = finding

"""The report as a rich table, for ``jaxwise watch`` (needs ``jaxwise[cli]``)."""

from __future__ import annotations

from typing import TextIO

from jaxwise._shared._extras import require
from jaxwise.watch._report import WatchReport, finding_lines, function_rows

__all__ = ["render"]

_WIDTH = 120  # when the stream is not a terminal


def render(report: WatchReport, stream: TextIO, fail_on: tuple[str, ...]) -> None:
    """Print ``report`` to ``stream``: the per-function table, then each finding."""
    console_mod = require("rich.console", extra="cli", feature="jaxwise watch's table")
    table_mod = require("rich.table", extra="cli", feature="jaxwise watch's table")
    text = require("rich.text", extra="cli", feature="jaxwise watch's table").Text
    terminal = stream.isatty()
    console = console_mod.Console(
        file=stream, width=None if terminal else _WIDTH, highlight=False, soft_wrap=False
    )
    console.print(text.assemble(("jaxwise watch", "bold"), ": ", report.headline()), soft_wrap=True)
    table = table_mod.Table(show_edge=False, pad_edge=False)
    for title, justify in (
        ("function", "left"),
        ("jitted at", "left"),
        ("calls", "right"),
        ("compiles", "right"),
        ("compile s", "right"),
        ("time", "right"),
    ):
        table.add_column(title, justify=justify)
    for row in function_rows(report):
        style = "bold red" if "!" in row[3] else None
        table.add_row(*(text(cell) for cell in row), style=style)
    if report.functions:
        console.print(table)
    findings = finding_lines(report)
    for line in findings:
        console.print(text.assemble(("! ", "red"), line), soft_wrap=True)
    if not findings:
        console.print("nothing flagged")
    for note in report.notes:
        console.print(text(f"note: {note}", style="dim"), soft_wrap=True)
    for error in report.errors:
        console.print(
            text(f"(watch could not finish a check: {error})", style="dim"), soft_wrap=True
        )
    if report.stopped:
        console.print(text.assemble(("stopped at the first NaN", "red"), " (exit code 3)"))
    triggered = report.triggered(fail_on)
    if triggered:
        failed = f"--fail-on {','.join(triggered)}"
        console.print(text.assemble((failed, "red"), " (exit code 3)"))

"""Building and writing the pages: atomic, under the run directory's shared lock.

A page is written to a temporary file renamed into place. An existing file is replaced only
when it is a jaxwise report itself (its ``<meta name="generator">``): any other file there is
refused by name, never overwritten.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from jaxwise._errors import UserError
from jaxwise._shared._atomic import atomic_write_text
from jaxwise._shared._lock import FileLock, LockHeld, describe_holder
from jaxwise._shared._page_target import check_output
from jaxwise.report._collect import collect
from jaxwise.report._html import run_html
from jaxwise.report._watch_html import watch_html

__all__ = ["run_report_html", "watch_report_html", "write_run_report", "write_watch_report"]

_RUN_LOCK = ".jaxwise-run.lock"  # the lock a job holds on its run directory while it runs


@contextlib.contextmanager
def _reading(run_dir: Path) -> Iterator[None]:
    """A shared lock on the run directory: refused while a job is writing it."""
    lock = FileLock(run_dir / _RUN_LOCK, shared=True, create=False)
    try:
        lock.acquire()
    except LockHeld as err:
        raise UserError(
            f"RUN_DIR {run_dir} is in use by {describe_holder(err.holder)}; wait for it to "
            "finish, then run `jaxwise report` again"
        ) from None
    except OSError:
        pass  # read-only, or no lock file: nothing to lock
    try:
        yield
    finally:
        lock.release()


def _write(path: Path, text: str, option: str) -> Path:
    check_output(path, option)
    try:
        return atomic_write_text(path, text)
    except OSError as err:
        raise UserError(f"{option} {path}: not written ({err.strerror or err})") from None


def run_report_html(run_dir: str | os.PathLike[str]) -> str:
    """The report of a run directory as one self-contained HTML page.

    Args:
        run_dir: the ``--out`` (or ``--run-dir``) directory of a ``jaxwise spiral``,
            ``train`` or ``label-errors`` run.

    Returns:
        The HTML text (inline SVG and style; no script; nothing loaded from the network).

    Raises:
        UserError: not a directory; no ``metrics.jsonl`` or ``summary.json`` there; a file
            there that is not strict JSON; a ``watch.json`` that is not a watch report; the
            directory in use by a running job.

    Examples:
        >>> import json, pathlib, tempfile
        >>> run = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (run / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "loss": 0.5}))
        >>> 'id="curves"' in run_report_html(run)
        True
    """
    path = Path(run_dir)
    with _reading(path):
        data = collect(path)
    try:
        return run_html(data)
    except ValueError as err:
        raise UserError(str(err)) from None


def write_run_report(
    run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None
) -> Path:
    """Write `run_report_html` of ``run_dir`` to ``out`` (default ``RUN_DIR/report.html``).

    Args:
        run_dir: the run directory.
        out: the page's path; an existing file there is replaced only if it is a report.

    Returns:
        The path written.

    Raises:
        UserError: as `run_report_html`; ``out`` a directory, in a missing directory, or an
            existing file that is not a jaxwise report.
    """
    target = Path(out) if out is not None else Path(run_dir) / "report.html"
    return _write(target, run_report_html(run_dir), "--out")


def watch_report_html(report: Mapping[str, Any]) -> str:
    """The ``watch`` report as one self-contained HTML page.

    Args:
        report: the watch report's JSON document (schema 1: ``Watch.report().to_json()``,
            or what ``jaxwise watch --json`` writes).

    Returns:
        The HTML text: the functions (calls, compiles, cache misses), the findings
            (steady-state recompiles, NaNs, failed donations), the transfers and the times.

    Raises:
        ValueError: a document that is not a watch report of schema 1.

    Examples:
        >>> doc = {"schema": 1, "functions": [], "nans": [], "donations": [],
        ...        "transfers": None, "seconds": {"total": 1.0, "compiling": 0.5}}
        >>> watch_report_html(doc).startswith("<!DOCTYPE html>")
        True
    """
    return watch_html(report)


def write_watch_report(report: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write `watch_report_html` of ``report`` to ``path`` (``jaxwise watch --html``).

    Args:
        report: the watch report's JSON document (``Watch.report().to_json()``).
        path: the page's path; an existing file there is replaced only if it is a report.

    Returns:
        The path written.

    Raises:
        UserError: ``path`` a directory, in a missing directory, or an existing file that is
            not a jaxwise report.
        ValueError: a document that is not a watch report of schema 1.
    """
    return _write(Path(path), watch_html(report), "--html")

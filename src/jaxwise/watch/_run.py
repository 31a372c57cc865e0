"""Run a user's script under a `Watch`: in-process, unchanged, its exit code kept.

The script runs as ``python SCRIPT ARGS...`` would run it: ``__name__ == "__main__"``,
``sys.argv`` set to ``[SCRIPT, *ARGS]``, the script's directory first on ``sys.path``, its
stdout untouched. Its exceptions are printed as Python prints them (without our frames) and
give exit code 1; ``SystemExit`` keeps its code. The report goes to stderr (a rich table) and,
with ``json_path``, to a strict JSON file. Exit code 3 when ``nans="stop"`` stopped the
script at a NaN or a ``fail_on`` condition holds.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from collections.abc import Sequence
from typing import Any, TextIO

from jaxwise._checks import UserError
from jaxwise._frames import is_library_file
from jaxwise.watch._report import WatchReport
from jaxwise.watch._watch import Watch

__all__ = ["FAILED", "run_script"]

FAILED = 3  # a NaN stopped the script, or a --fail-on condition held


def _exit_code(err: SystemExit, stream: TextIO) -> int:
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stream)
    return 1


def _print_exception(err: BaseException, stream: TextIO) -> None:
    """Print ``err`` as Python would for the script: our frames and runpy's left out."""
    tb = err.__traceback__
    while tb is not None and is_library_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    traceback.print_exception(type(err), err, tb, file=stream)


def _check_outputs(script: str, json_path: str | None) -> None:
    if not os.path.isfile(script):
        raise UserError(f"watch: no such script: {script}")
    if json_path is not None:
        parent = os.path.dirname(os.path.abspath(json_path))
        if not os.path.isdir(parent):
            raise UserError(f"watch: --json {json_path}: the directory {parent} does not exist")


def _run(script: str, argv: Sequence[str], watch: Watch, stream: TextIO) -> int:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *argv]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    try:
        with watch:
            runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as err:
        return _exit_code(err, stream)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", file=stream)
        return 130
    except Exception as err:
        _print_exception(err, stream)
        return 1
    finally:
        sys.argv = saved_argv
        sys.path[:] = saved_path


def run_script(
    script: str,
    argv: Sequence[str] = (),
    *,
    json_path: str | None = None,
    nans: str | None = None,
    transfers: bool = False,
    fail_on: Sequence[str] = (),
    warmup: int = 2,
    stream: TextIO | None = None,
    rich: bool = True,
) -> int:
    """Run ``script`` with ``argv`` under a `Watch` and report; returns the exit code.

    Args:
        script: path of the Python script.
        argv: its arguments.
        json_path: also write the report as strict JSON there.
        nans, transfers, fail_on, warmup: as for `Watch`.
        stream: where the report goes (default ``sys.stderr``).
        rich: render a rich table (needs ``jaxwise[cli]``); else plain text.

    Returns:
        The script's exit code; 3 when a NaN stopped it or a ``fail_on`` condition held.

    Examples:
        >>> import io, pathlib, tempfile
        >>> script = pathlib.Path(tempfile.mkdtemp()) / "hello.py"
        >>> _ = script.write_text("print('hello')")
        >>> run_script(str(script), stream=io.StringIO(), rich=False)
        hello
        0
    """
    out: TextIO = stream if stream is not None else sys.stderr
    _check_outputs(script, json_path)
    render = _renderer(rich)
    watch = Watch(nans=nans, transfers=transfers, warmup=warmup, fail_on=tuple(fail_on))
    code = _run(script, argv, watch, out)
    report = watch.report()
    if report.stopped or report.triggered(watch.fail_on):
        code = FAILED
    report = watch.report(exit_code=code)
    sys.stdout.flush()
    render(report, out, watch.fail_on)
    if json_path is not None:
        with open(json_path, "w") as f:
            json.dump(report.to_json(), f, allow_nan=False, indent=1)
            f.write("\n")
    return code


def _renderer(rich: bool) -> Any:
    if not rich:
        return _plain
    from jaxwise._extras import require

    try:
        require("rich", extra="cli", feature="jaxwise watch's table")
    except ImportError as err:
        raise UserError(str(err)) from None
    from jaxwise.watch._render import render

    return render


def _plain(report: WatchReport, stream: TextIO, fail_on: tuple[str, ...]) -> None:
    print(str(report), file=stream)
    triggered = report.triggered(fail_on)
    if report.stopped:
        print("jaxwise watch: stopped at the first NaN (exit code 3)", file=stream)
    if triggered:
        print(f"jaxwise watch: --fail-on {','.join(triggered)} (exit code 3)", file=stream)

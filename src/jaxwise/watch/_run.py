"""Run a user's script under a `Watch`: in-process, unchanged, its exit code kept.

The script runs as ``python SCRIPT ARGS...`` would run it: ``__name__ == "__main__"``, an
absolute ``__file__`` (and so absolute paths in tracebacks), ``sys.argv`` set to ``[SCRIPT,
*ARGS]``, the script's directory first on ``sys.path``, its stdout untouched. Its exceptions
are printed as Python prints them (without the watch's frames) and give exit code 1;
``SystemExit`` keeps its code; a ``KeyboardInterrupt`` prints its traceback and, after the
report, the process dies by SIGINT, as Python's does (the parent sees -2). NumPy's global
random state is what plain Python leaves: importing jax draws from it (jax's cluster module
calls ``np.random.rand(5)``), and jax is already imported when the script runs, so the state is
reset to the one before the watch imported jax and the same draws are made when the script
first imports jax (the command line takes the state before it imports jax). The
report goes to stderr (a rich table) and, with ``json_path``, to a strict JSON file. Exit code
3 when ``nans="stop"`` stopped the script at a NaN or a ``fail_on`` condition holds.
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import importlib.machinery
import io
import json
import os
import pkgutil
import runpy
import signal
import sys
import traceback
import types
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from jaxwise._shared._atomic import atomic_write_text, probe_writable
from jaxwise._shared._checks import UserError
from jaxwise._shared._frames import is_library_file
from jaxwise.watch._report import WatchReport
from jaxwise.watch._watch import Watch

__all__ = ["FAILED", "INTERRUPTED", "run_script"]

FAILED = 3  # a NaN stopped the script, or a --fail-on condition held
INTERRUPTED = -2  # the script was interrupted (Ctrl-C): the process dies by SIGINT
_OWN = os.path.dirname(os.path.abspath(__file__)) + os.sep  # jaxwise/watch/
_MAX_DRAWS = 100_000


def _same_state(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and tuple(a[2:]) == tuple(b[2:])


def _draws_since(before: tuple[Any, ...]) -> int | None:
    """How many 32-bit words were drawn from NumPy's global generator since ``before``."""
    after = np.random.get_state()
    probe = np.random.RandomState()
    probe.set_state(before)
    bit_generator = getattr(probe, "_bit_generator", None)
    if bit_generator is None:
        return None
    for draws in range(_MAX_DRAWS):
        if _same_state(probe.get_state(), after):  # type: ignore[arg-type]
            return draws
        bit_generator.random_raw()
    return None


@contextlib.contextmanager
def _numpy_as_plain_python(before: tuple[Any, ...] | None) -> Iterator[None]:
    """NumPy's global random state as ``python SCRIPT`` has it: reset to ``before``, and the
    draws importing jax made done again when the script (or a library it imports) first
    imports jax."""
    draws = _draws_since(before) if before is not None else None
    if before is None or draws is None:
        yield
        return
    np.random.set_state(before)
    generator = getattr(np.random.mtrand, "_rand", None)
    original = builtins.__import__

    def hook(name: str, globals: Any = None, *args: Any, **kwargs: Any) -> Any:
        importer = (globals or {}).get("__name__", "") if isinstance(globals, dict) else ""
        if (name == "jax" or name.startswith("jax.")) and not importer.startswith("jaxwise"):
            builtins.__import__ = original
            if draws and generator is not None:
                generator._bit_generator.random_raw(draws)
        return original(name, globals, *args, **kwargs)

    builtins.__import__ = hook
    try:
        yield
    finally:
        if builtins.__import__ is hook:
            builtins.__import__ = original


def _exit_code(err: SystemExit, stream: TextIO) -> int:
    code = err.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=stream)
    return 1


def _without_own_frames(report: traceback.TracebackException) -> None:
    """Drop the watch's frames (``jaxwise/watch/``) from ``report`` and its chained causes."""
    seen: set[int] = set()
    todo = [report]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        kept = [f for f in current.stack if not (f.filename or "").startswith(_OWN)]
        current.stack = traceback.StackSummary.from_list(kept)
        todo += [c for c in (current.__cause__, current.__context__) if c is not None]
        todo += list(getattr(current, "exceptions", None) or ())


def _print_exception(err: BaseException, stream: TextIO) -> None:
    """Print ``err`` as Python would for the script: our frames and runpy's left out."""
    tb = err.__traceback__
    while tb is not None and is_library_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    report = traceback.TracebackException(type(err), err, tb, compact=True)
    _without_own_frames(report)
    stream.write("".join(report.format()))


def _is_watch_json(path: str) -> bool:
    """Whether ``path`` holds a ``watch --json`` report (the only file ``--json`` replaces)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            doc = json.loads(f.read(1 << 24))
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and "schema" in doc and "functions" in doc


def _check_outputs(script: str, json_path: str | None, html_path: str | None = None) -> None:
    """Refuse, before the script runs, an output that cannot or must not be written."""
    if not os.path.isfile(script):
        raise UserError(f"watch: no such script: {script}")
    for option, path in (("--json", json_path), ("--html", html_path)):
        if path is None:
            continue
        if os.path.exists(path) and os.path.samefile(path, script):
            raise UserError(f"watch: {option} {path}: is the script itself; choose another file")
        if option == "--html":
            from jaxwise._shared._page_target import check_output

            try:
                check_output(Path(path), option)
            except UserError as err:
                raise UserError(f"watch: {err}") from None
            continue
        if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
            continue  # a device or a pipe (``--json /dev/stdout``): written in place
        parent = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise UserError(f"watch: {option} {path}: is a directory, expected a file name")
        if not os.path.isdir(parent):
            raise UserError(f"watch: {option} {path}: the directory {parent} does not exist")
        if os.path.exists(path) and not _is_watch_json(path):
            raise UserError(
                f"watch: {option} {path}: the file exists and is not a jaxwise watch report; "
                f"choose another {option} or move it away"
            )
        try:
            probe_writable(path)
        except OSError as err:
            why = err.strerror or err
            raise UserError(f"watch: {option} {path}: not writable ({why})") from None


def _run_as_main(path: str) -> None:
    """Run the script at ``path`` as ``python SCRIPT`` does: in a fresh ``__main__`` module,
    ``__file__`` absolute, ``sys.argv`` left as given (``runpy.run_path`` would set
    ``sys.argv[0]`` to ``path``; Python keeps it as typed). A zip application goes to runpy."""
    if zipfile.is_zipfile(path):
        runpy.run_path(path, run_name="__main__")
        return
    with io.open_code(path) as f:
        code = pkgutil.read_code(f)  # a compiled .pyc script
    if code is None:
        with io.open_code(path) as f:
            code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=path,
        __cached__=None,
        __loader__=importlib.machinery.SourceFileLoader("__main__", path),
        __package__=None,
        __spec__=None,
    )
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def _run(
    script: str, argv: Sequence[str], watch: Watch, stream: TextIO, state: tuple[Any, ...] | None
) -> int:
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = [script, *argv]
    path = os.path.abspath(script)
    sys.path.insert(0, os.path.dirname(path))
    try:
        with _numpy_as_plain_python(state), watch:
            _run_as_main(path)
        return 0
    except SystemExit as err:
        return _exit_code(err, stream)
    except KeyboardInterrupt as err:
        _print_exception(err, stream)
        return INTERRUPTED
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
    html_path: str | None = None,
    nans: str | None = None,
    transfers: bool = False,
    fail_on: Sequence[str] = (),
    warmup: int = 2,
    stream: TextIO | None = None,
    rich: bool = True,
    numpy_state: tuple[Any, ...] | None = None,
) -> int:
    """Run ``script`` with ``argv`` under a `Watch` and report; returns the exit code.

    Args:
        script: path of the Python script.
        argv: its arguments.
        json_path: also write the report as strict JSON there.
        html_path: also write the report as one self-contained HTML page there.
        nans: as for `Watch`.
        transfers: as for `Watch`.
        fail_on: as for `Watch`.
        warmup: as for `Watch`.
        stream: where the report goes (default ``sys.stderr``).
        rich: render a rich table (needs ``jaxwise[cli]``); else plain text.
        numpy_state: NumPy's global random state from before jax was imported
            (``np.random.get_state()``), to give the script the state plain Python would.

    Returns:
        The script's exit code; 3 when a NaN stopped it or a ``fail_on`` condition held.
            After a ``KeyboardInterrupt`` it does not return: the report is written, then the
            process dies by SIGINT.

    Raises:
        UserError: the ``--json`` report could not be written.

    Examples:
        >>> import io, pathlib, tempfile
        >>> script = pathlib.Path(tempfile.mkdtemp()) / "hello.py"
        >>> _ = script.write_text("print('hello')")
        >>> run_script(str(script), stream=io.StringIO(), rich=False)
        hello
        0
    """
    out: TextIO = stream if stream is not None else sys.stderr
    _check_outputs(script, json_path, html_path)
    render = _renderer(rich)
    watch = Watch(nans=nans, transfers=transfers, warmup=warmup, fail_on=tuple(fail_on))
    code = _run(script, argv, watch, out, numpy_state)
    report = watch.report()
    if code != INTERRUPTED and (report.stopped or report.triggered(watch.fail_on)):
        code = FAILED
    report = watch.report(exit_code=code)
    sys.stdout.flush()
    render(report, out, watch.fail_on)
    if json_path is not None:
        text = json.dumps(report.to_json(), allow_nan=False, indent=1) + "\n"
        try:
            if os.path.exists(json_path) and not os.path.isfile(json_path):
                with open(json_path, "w", encoding="utf-8") as f:  # a device or a pipe
                    f.write(text)
            else:
                atomic_write_text(json_path, text)
        except OSError as err:
            why = err.strerror or err
            raise UserError(f"watch: --json {json_path}: not written ({why})") from None
    if html_path is not None:
        from jaxwise.report import write_watch_report

        write_watch_report(report.to_json(), html_path)
    if code == INTERRUPTED:
        _die_by_sigint()
    return code


def _die_by_sigint() -> None:
    """End the process as Python does after an uncaught ``KeyboardInterrupt``: exit handlers
    run, then the default SIGINT action kills it (the parent sees -2)."""
    sys.stdout.flush()
    sys.stderr.flush()
    atexit._run_exitfuncs()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)


def _renderer(rich: bool) -> Any:
    if not rich:
        return _plain
    from jaxwise._shared._extras import require

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

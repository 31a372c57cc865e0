"""Where jobs write: directories they own and lock, files never overwritten by surprise.

A run directory (``--out``/``--run-dir``) belongs to one run of one job. Its marker
``.jaxwise-run.json`` records the job, the run's id, its options and a fingerprint of its
data, and the names jaxwise wrote there. A job takes the directory's lock (an ``flock`` on
``.jaxwise-run.lock`` that names its holder) before any work, so a second process is
refused at once and writes nothing; it refuses a directory made by another job, or by the
same job with other options or data, unless ``--force`` (which starts it afresh: the
earlier run's files are deleted, files jaxwise did not write are kept). A directory may
hold other files: jaxwise writes only its own names there, and refuses if one of them
exists but was not written by jaxwise.

A single output file (``label-errors --out``, ``predict --out``) is locked while a job
writes it (``.<name>.jaxwise-lock`` beside it, removed afterwards) and never replaced
unless ``--force`` is given — not even when another program creates it meanwhile.

Every write goes to a temporary file renamed into place, removed again if the write
fails: a full disk leaves no temporary file and the previous version intact, and is one
``OSError`` (``errno.ENOSPC``) naming the file, which the CLI reports in one line.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from jaxwise._shared._atomic import temporary_name
from jaxwise._shared._checks import UserError
from jaxwise._shared._disk import naming
from jaxwise._shared._lock import FileLock, LockHeld, describe_holder

MARKER = ".jaxwise-run.json"
SUMMARY = "summary.json"  # a job's summary (what --json prints), read by `jaxwise report`
LOCK = ".jaxwise-run.lock"
HOLD_ENV = "JAXWISE_TEST_HOLD_LOCKS"

__all__ = [
    "LOCK",
    "MARKER",
    "SUMMARY",
    "OutputFile",
    "RunDir",
    "append_line",
    "atomic_write",
    "hold_for_tests",
    "locked_reader",
    "read_marker",
    "warn",
    "write_summary",
]


def warn(message: str) -> None:
    """One ``jaxwise: warning: …`` line on stderr (jobs otherwise print nothing)."""
    print(f"jaxwise: warning: {' '.join(message.split())}", file=sys.stderr)


def hold_for_tests() -> None:
    """With ``$JAXWISE_TEST_HOLD_LOCKS=DIR``: wait, holding the job's locks, for a test.

    A test's handshake through two FIFOs it created: this process writes its pid into
    ``DIR/held`` (blocks until the test reads it), then reads ``DIR/release`` (blocks
    until the test writes it). No sleeping, no timing: the test knows the locks are held.
    """
    where = os.environ.get(HOLD_ENV)
    if not where:
        return
    with open(os.path.join(where, "held"), "w") as fifo:
        fifo.write(str(os.getpid()))
    with open(os.path.join(where, "release")) as fifo:
        fifo.read()


def atomic_write(
    path: Path, write: Callable[[IO[str]], object], *, replace: bool = True, option: str = "--out"
) -> Path:
    """Write ``path`` through ``write(file)`` into a temporary file renamed into place.

    With ``replace=False`` an existing ``path`` is never replaced (even one created while
    ``write`` ran): a `UserError`. On any failure the temporary file is removed; a
    full disk is ``OSError(ENOSPC)`` naming ``path``.
    """
    tmp = temporary_name(path)
    try:
        with tmp.open("w", newline="", encoding="utf-8") as f:
            write(f)
        if replace:
            os.replace(tmp, path)
        else:
            os.link(tmp, path)
    except FileExistsError:
        raise UserError(
            f"{option} {path}: the file was created by another program while jaxwise ran; "
            "pass --force to replace it"
        ) from None
    except OSError as err:
        raise naming(err, path) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def append_line(path: Path, line: str) -> None:
    """Append one line to ``path``; on failure the file is cut back to what it was."""
    size = path.stat().st_size if path.exists() else 0
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as err:
        with contextlib.suppress(OSError):
            os.truncate(path, size)
        raise naming(err, path) from None


def write_summary(run: RunDir | None, summary: dict[str, Any]) -> None:
    """Write a job's summary (strict JSON) as ``summary.json`` of its run directory, if any."""
    if run is not None and SUMMARY in run.names:
        text = json.dumps(summary, allow_nan=False, indent=1) + "\n"
        atomic_write(run / SUMMARY, lambda f: f.write(text))


def read_marker(directory: Path) -> dict[str, Any] | None:
    """The marker of a run directory, or None (none, unreadable, or not a marker)."""
    try:
        data = json.loads((directory / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    return [
        f"{key} {old.get(key)!r}, now {new.get(key)!r}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


class RunDir:
    """A run directory a job owns, locks and writes its own named outputs into.

    Args:
        path: the directory (created if missing).
        option: the command-line option that named it (for messages), e.g. ``"--out"``.
        names: every file or directory name the job may write there.
        job: the job's name, recorded in the marker (``train``, ``label-errors``, ``spiral``).
    """

    def __init__(
        self, path: str | os.PathLike[str], option: str, names: Iterable[str], job: str
    ) -> None:
        self.path = Path(path)
        self.option = option
        self.names = frozenset(names)
        self.job = job
        self.written: set[str] = set()
        self.run_id: str | None = None
        self.previous: dict[str, Any] | None = None
        self._record: dict[str, Any] = {}
        self._lock: FileLock | None = None
        self._created = False

    # -------------------------------------------------------------- the lock

    def lock(self) -> RunDir:
        """Create the directory and take its lock: refused at once (one line) when held."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"{self.option} {self.path}: is a file, expected a directory")
        try:
            self._created = not self.path.exists()
            self.path.mkdir(parents=True, exist_ok=True)
            lock = FileLock(self.path / LOCK)
            stale = lock.acquire()
        except LockHeld as err:
            raise UserError(
                f"{self.option} {self.path} is in use by {describe_holder(err.holder)}; wait "
                f"for it to finish or choose another {self.option}"
            ) from None
        except OSError as err:
            raise UserError(
                f"{self.option} {self.path}: not writable ({err.strerror or err})"
            ) from None
        self._lock = lock
        if stale:
            warn(
                f"{self.option} {self.path} was locked by {describe_holder(stale)}, which "
                "ended without releasing it; taking it over"
            )
        self.previous = read_marker(self.path)
        return self

    def release(self, failed: bool = False) -> None:
        """Release the lock; after a failure, remove the directory if this job made it empty."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if failed and self._created:
            with contextlib.suppress(OSError):
                (self.path / LOCK).unlink()
                self.path.rmdir()  # only when nothing else was written

    def __enter__(self) -> RunDir:
        return self.lock()

    def __exit__(self, kind: object, *exc: object) -> None:
        self.release(failed=kind is not None)

    # -------------------------------------------------------------- ownership

    def claim(
        self,
        options: dict[str, Any],
        data: dict[str, Any] | None = None,
        *,
        resume: bool = False,
        force: bool = False,
        can_force: bool = True,
    ) -> RunDir:
        """Check the directory is this run's to write (see the module docstring); mark it.

        Args:
            options: the run's settings (JSON values).
            data: a fingerprint of the run's data.
            resume: continue the run found there (its options and data are the caller's to
                check; its run id is kept).
            force: start afresh: delete what an earlier run wrote there.
            can_force: whether the command has ``--force`` (for the messages).
        """
        if self._lock is None:
            self.lock()
        previous = self.previous or {}
        force_hint = " or pass --force to start it afresh" if can_force else ""
        job = previous.get("job")
        if job is not None and job != self.job and not force:
            raise UserError(
                f"{self.option} {self.path} holds a `jaxwise {job}` run; choose another "
                f"{self.option}{force_hint}"
            )
        if job == self.job and not (resume or force) and "options" in previous:
            changed = _differences(previous.get("options") or {}, options)
            if changed or previous.get("data") != data:
                what = f"other settings ({'; '.join(changed[:3])})" if changed else "other data"
                raise UserError(
                    f"{self.option} {self.path} holds a `jaxwise {self.job}` run with {what}; "
                    f"choose another {self.option}{force_hint}"
                )
        self.written = set() if force else {str(n) for n in previous.get("files", [])}
        if force:
            self._clear(previous)
        for name in sorted(self.names):
            if (self.path / name).exists() and name not in self.written:
                raise UserError(
                    f"{self.option} {self.path}: {name} exists and was not written by jaxwise; "
                    f"choose another {self.option} or move it away"
                )
        # a resumed run keeps its id (None for a run of an older jaxwise: its checkpoints
        # carry none, and are taken as they are)
        keep_id = resume and job == self.job
        self.run_id = previous.get("run_id") if keep_id else uuid.uuid4().hex
        self._record = {"format": 1, "job": self.job, "run_id": self.run_id}
        self._record.update(options=options, data=data)
        self._write_marker()
        return self

    def _clear(self, previous: dict[str, Any]) -> None:
        """Delete the earlier run's outputs (the names its marker lists; nothing else)."""
        for name in previous.get("files", []):
            name = str(name)
            if not name or "/" in name or name in (".", "..") or name.startswith("."):
                continue
            target = self.path / name
            try:
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink(missing_ok=True)
            except OSError as err:
                raise UserError(
                    f"{self.option} {self.path}: cannot remove the earlier run's {name} "
                    f"({err.strerror or err})"
                ) from None

    def _write_marker(self) -> None:
        record = dict(self._record, files=sorted(self.written))
        atomic_write(self.path / MARKER, lambda f: f.write(json.dumps(record)))

    def __truediv__(self, name: str) -> Path:
        """The path of one of our names, recorded as written by jaxwise (before it is written)."""
        if name not in self.names:
            raise ValueError(f"{name!r} is not one of this job's output names {sorted(self.names)}")
        if name not in self.written:
            self.written.add(name)
            self._write_marker()
        return self.path / name


class OutputFile:
    """A single output file (``--out FILE``): checked and locked before any work.

    Args:
        path: the file to write.
        option: the option that named it, for messages.
        force: replace the file if it exists.
    """

    def __init__(self, path: str | os.PathLike[str], option: str, force: bool) -> None:
        self.path = Path(path)
        self.option = option
        self.force = force
        self._lock: FileLock | None = None

    def claim(self) -> OutputFile:
        """Refuse a directory, an existing file (without ``force``), or a file being written."""
        target = self.path
        if target.is_dir():
            raise UserError(f"{self.option} {target}: is a directory, expected a file name")
        if target.exists() and not self.force:
            raise UserError(f"{self.option} {target}: the file exists; pass --force to replace it")
        parent = target.parent if str(target.parent) else Path(".")
        lock = FileLock(parent / f".{target.name}.jaxwise-lock", remove=True)
        try:
            parent.mkdir(parents=True, exist_ok=True)
            stale = lock.acquire()
        except LockHeld as err:
            raise UserError(
                f"{self.option} {target} is being written by {describe_holder(err.holder)}; "
                f"wait for it to finish or choose another {self.option}"
            ) from None
        except OSError as err:
            raise UserError(
                f"{self.option} {target}: not writable ({err.strerror or err})"
            ) from None
        self._lock = lock
        if stale:
            warn(
                f"{self.option} {target} was being written by {describe_holder(stale)}, which "
                "ended without finishing; taking it over"
            )
        if target.exists() and not self.force:  # created while we took the lock
            self.release()
            raise UserError(f"{self.option} {target}: the file exists; pass --force to replace it")
        return self

    def write_csv(self, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Path:
        """Write ``rows`` (floats to 6 digits) atomically; never replace without ``force``."""

        def write(f: IO[str]) -> None:
            writer = csv.DictWriter(f, fieldnames=list(columns))
            writer.writeheader()
            for row in rows:
                writer.writerow(
                    {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
                )

        return atomic_write(self.path, write, replace=self.force, option=self.option)

    def release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> OutputFile:
        return self.claim()

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def locked_reader(run_dir: Path, option: str) -> Iterator[dict[str, Any] | None]:
    """A shared lock on a run directory while a job reads it; yields its marker."""
    lock = FileLock(run_dir / LOCK, shared=True, create=False)
    try:
        lock.acquire()
    except LockHeld as err:
        raise UserError(
            f"{option} {run_dir} is in use by {describe_holder(err.holder)}; wait for it to finish"
        ) from None
    except OSError:
        pass  # a read-only run directory (or one of an older jaxwise): nothing to lock
    try:
        yield read_marker(run_dir)
    finally:
        lock.release()

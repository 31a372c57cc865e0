"""The `MetricWriter` protocol, scalar checking, and `JsonlWriter` (one JSON object per line)."""

from __future__ import annotations

import json
import math
import os
import weakref
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, TextIO, runtime_checkable

from jaxwise._shared._atomic import atomic_write_text
from jaxwise._shared._checks import check_path, is_int
from jaxwise._shared._lock import FileLock, LockHeld, describe_holder

__all__ = ["JsonlWriter", "MetricWriter", "check_scalars", "claim"]


@runtime_checkable
class MetricWriter(Protocol):
    """Where a run's scalars go: `JsonlWriter`, `TensorBoardWriter`, `MLflowWriter`, or yours.

    ``write`` records one step's scalars; a writer opened on a directory or run that already
    holds steps (a resumed run) continues it, so that no step appears twice: the first
    ``write`` at step ``s`` replaces what was recorded at steps ``>= s`` (JSONL, TensorBoard)
    or skips the steps already recorded (MLflow, whose runs are append-only).
    """

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Record ``scalars`` (name → value) at ``step`` (an int >= 0).

        Args:
            step: the step (an int >= 0).
            scalars: name -> value (anything ``float()`` takes).
        """
        ...

    def flush(self) -> None:
        """Make everything written so far durable (readable by another process)."""
        ...

    def close(self) -> None:
        """Flush and release the writer's files; further writes raise ``ValueError``."""
        ...


def check_scalars(step: object, scalars: object) -> dict[str, float]:
    """``scalars`` as a ``dict[str, float]`` after checking ``step`` and every entry.

    >>> check_scalars(3, {"loss": 0.5})
    {'loss': 0.5}
    """
    if not is_int(step) or int(step) < 0:  # pyright: ignore[reportArgumentType]
        raise TypeError(f"`step` must be an int >= 0, got {step!r}")
    if not isinstance(scalars, Mapping):
        raise TypeError(
            f"`scalars` must be a mapping of name to float, got {type(scalars).__name__}"
        )
    out: dict[str, float] = {}
    for name, value in scalars.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"`scalars` keys must be non-empty strings, got {name!r}")
        try:
            out[name] = float(value)
        except (TypeError, ValueError):
            raise TypeError(
                f"`scalars[{name!r}]` must be a real number, got {type(value).__name__}"
            ) from None
    return out


def claim(owner: object, lock_path: Path, what: str) -> FileLock:
    """The writer lock of ``owner`` on its output: an ``flock`` on ``lock_path``, held till close.

    One writer per file (or log directory), across processes and within one: a second one is
    refused by name while the first is open, as a `jaxwise.checkpoint.Checkpointer` refuses a
    second writer of its directory. The operating system releases the lock when its holder
    dies (even on ``SIGKILL``), so a killed run's successor is never refused; a writer that is
    garbage-collected without ``close()`` releases it too.

    Args:
        owner: the writer (its lock is released when it is garbage-collected).
        lock_path: the lock file (removed on release).
        what: the writer and its output as the message names them (``JsonlWriter('m.jsonl')``).

    Raises:
        ValueError: another writer holds the lock.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_path, remove=True)
    try:
        lock.acquire()
    except LockHeld as err:
        holder = describe_holder(err.holder)
        if err.holder and err.holder.get("pid") == os.getpid():
            holder = "another writer of this process"
        raise ValueError(
            f"{what}: already open in {holder}; two writers on one output would lose each "
            "other's records: close the first writer before opening another (a resumed run "
            "opens its writers after the old ones are closed), or write elsewhere"
        ) from None
    weakref.finalize(owner, lock.release)
    return lock


def _is_step(value: object) -> bool:
    """A number that can be a step: an int, or a float such as ``1.0`` (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _kept_lines(path: Path, key: str, step: int) -> list[str]:
    """The lines of ``path`` to keep when a write at ``step`` continues it.

    A line whose ``key`` is a number ``>= step`` goes (a resumed run rewrites it); every other
    line is kept verbatim, except a last line cut by a kill (no newline, not JSON). A file
    whose JSON objects have no numeric ``key`` (another writer's, e.g. the CLI's ``epoch``
    lines) is refused: its lines are the user's and are never deleted.
    """
    if not path.exists():
        return []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines(keepends=True)
    kept: list[str] = []
    foreign: list[str] = []
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except ValueError:
            if i == len(lines) - 1 and not line.endswith("\n"):
                continue  # the half-written last line of a killed process
            kept.append(line if line.endswith("\n") else line + "\n")
            continue
        if isinstance(record, dict) and _is_step(record.get(key)):
            if record[key] < step:
                kept.append(line if line.endswith("\n") else line + "\n")
        elif isinstance(record, dict):
            foreign.append(line.strip())
        else:
            kept.append(line if line.endswith("\n") else line + "\n")
    if foreign:
        keys = sorted({k for line in foreign for k in json.loads(line)})
        raise ValueError(
            f"JsonlWriter({str(path)!r}, step_key={key!r}): {len(foreign)} line(s) of the "
            f"file have no numeric {key!r} field (their fields: {', '.join(keys[:8])}); "
            f"they are not this writer's lines and are never deleted: pass the file's own "
            f"step field (e.g. step_key='epoch' for a `jaxwise train` run) or another path"
        )
    return kept


class JsonlWriter:
    """Scalars as JSON lines, ``{"<step_key>": step, name: value, ...}`` (``metrics.jsonl``).

    A non-finite value is written as ``null`` (JSON has no NaN). Opened on an existing file
    (a resumed run), the first ``write`` at step ``s`` rewrites the file without its lines at
    steps ``>= s`` (atomically; a step written as ``1.0`` counts as step 1), so steps logged
    by a killed run after its last checkpoint are replaced, never duplicated. Every other
    line is kept; a file whose lines have no numeric ``step_key`` field (a `jaxwise train`
    run's ``metrics.jsonl`` is keyed ``epoch``) is refused with a ``ValueError``. One writer
    per file: a second `JsonlWriter` on ``path`` is refused (``ValueError``, naming the
    process that holds it) until the first is closed (an ``flock`` on ``.<name>.jaxwise-lock``
    beside the file, released on ``close()`` and when its process dies).

    Args:
        path: the file (its directory is created).
        step_key: the name of the step field (the CLI writes ``"epoch"``).

    Examples:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl"
        >>> with JsonlWriter(path) as w:
        ...     w.write(1, {"loss": 0.5})
        >>> path.read_text()
        '{"step": 1, "loss": 0.5}\\n'
    """

    def __init__(self, path: str | os.PathLike[str], *, step_key: str = "step") -> None:
        self.path = check_path(path, "path")
        if not isinstance(step_key, str) or not step_key:
            raise TypeError(f"`step_key` must be a non-empty string, got {step_key!r}")
        self.step_key = step_key
        self._file: TextIO | None = None
        self._closed = False
        lock_path = self.path.parent / f".{self.path.name}.jaxwise-lock"
        self._lock = claim(self, lock_path, f"JsonlWriter({str(self.path)!r})")

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Append one line for ``step`` (the first write of a resumed file truncates first).

        Args:
            step: the step (an int >= 0).
            scalars: name -> value (anything ``float()`` takes).

        Raises:
            TypeError: ``step`` or an entry of ``scalars`` is not what is expected.
            ValueError: the writer is closed, or the file holds lines of another writer
                (no numeric ``step_key``), which are never deleted.
        """
        values = check_scalars(step, scalars)
        if self._closed:
            raise ValueError(f"JsonlWriter({str(self.path)!r}) is closed")
        if self._file is None:
            self._file = self._open(int(step))
        record: dict[str, float | int | None] = {self.step_key: int(step)}
        record.update({k: (v if math.isfinite(v) else None) for k, v in values.items()})
        self._file.write(json.dumps(record, allow_nan=False) + "\n")

    def _open(self, step: int) -> TextIO:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = _kept_lines(self.path, self.step_key, step)
        if self.path.exists():
            atomic_write_text(self.path, "".join(kept))
        return self.path.open("a", encoding="utf-8")

    def flush(self) -> None:
        """Flush the file to the operating system."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Close the file and release the path for another writer (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file: TextIO | None = None
        self._closed = True
        self._lock.release()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The `MetricWriter` protocol, scalar checking, and `JsonlWriter` (one JSON object per line)."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, TextIO, runtime_checkable

from jaxwise._atomic import atomic_write_text
from jaxwise._checks import check_path, is_int

__all__ = ["JsonlWriter", "MetricWriter", "check_scalars"]


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


def _read_records(path: Path, key: str) -> list[dict[str, object]]:
    """The JSON objects of ``path`` with an int ``key`` (a line cut by a kill is dropped)."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and is_int(record.get(key)):
            records.append(record)
    return records


class JsonlWriter:
    """Scalars as JSON lines, ``{"<step_key>": step, name: value, ...}`` (``metrics.jsonl``).

    A non-finite value is written as ``null`` (JSON has no NaN). Opened on an existing file
    (a resumed run), the first ``write`` at step ``s`` rewrites the file without its lines at
    steps ``>= s`` (atomically), so steps logged by a killed run after its last checkpoint
    are replaced, never duplicated.

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

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Append one line for ``step`` (the first write of a resumed file truncates first).

        Args:
            step: the step (an int >= 0).
            scalars: name -> value (anything ``float()`` takes).

        Raises:
            TypeError: ``step`` or an entry of ``scalars`` is not what is expected.
            ValueError: the writer is closed.
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
        records = _read_records(self.path, self.step_key)
        kept = [r for r in records if int(r[self.step_key]) < step]  # type: ignore[arg-type]
        if self.path.exists():
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        return self.path.open("a", encoding="utf-8")

    def flush(self) -> None:
        """Flush the file to the operating system."""
        if self._file is not None:
            self._file.flush()

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file: TextIO | None = None
        self._closed = True

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

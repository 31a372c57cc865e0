"""What a run directory holds, read for the report: every artifact a jaxwise job writes there.

A run directory (the ``--out``/``--run-dir`` of ``spiral``, ``train``, ``label-errors``) may
hold ``metrics.jsonl`` (one JSON object per epoch), ``summary.json`` (what ``--json`` prints:
compile counts and times, the guarantees checked, DP ε and the audit, the suspected label
errors…), the marker ``.jaxwise-run.json`` (the job and its options), a ``watch.json``
(``jaxwise watch --json RUN_DIR/watch.json …``) and the job's PNG plots. Each is optional
except that a run must have recorded something: ``metrics.jsonl`` or ``summary.json``.

Every JSON file is read strictly: ``NaN``/``Infinity`` or a malformed line is a `UserError`
naming the file (and line).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxwise._errors import UserError

__all__ = ["PLOTS", "RunData", "collect", "finite_number", "loads_strict"]

#: The PNG plots jobs write, in the order the report shows them, with their captions.
PLOTS = (
    ("curves.png", "training and validation curves (matplotlib)"),
    ("loss.png", "training loss per step and learning rate"),
    ("decision_boundary.png", "decision boundary, hardest examples circled"),
    ("confusion.png", "confusion matrix on the validation rows"),
)
_MAX_PLOT_BYTES = 8 * 2**20


@dataclasses.dataclass(frozen=True)
class RunData:
    """The artifacts of one run directory (absent ones ``None`` or empty).

    Attributes:
        path: the run directory.
        marker: the job, its run id and options (``.jaxwise-run.json``).
        summary: the job's summary (``summary.json``).
        metrics: the records of ``metrics.jsonl``, in order.
        watch: a ``watch --json`` report found there (``watch.json``, schema 1).
        plots: ``(file name, caption, base64 PNG)`` of the job's plots found there.
    """

    path: Path
    marker: Mapping[str, Any] | None
    summary: Mapping[str, Any] | None
    metrics: tuple[Mapping[str, Any], ...]
    watch: Mapping[str, Any] | None
    plots: tuple[tuple[str, str, str], ...]

    @property
    def job(self) -> str:
        """The job that wrote the run (``"train"``…), ``"run"`` when unknown."""
        for source in (self.summary, self.marker):
            if source and isinstance(source.get("job"), str):
                return source["job"]
        return "run"


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON (expected a finite number or null)")


def loads_strict(text: str, what: str) -> Any:
    """Parse strict JSON (no ``NaN``/``Infinity``); a bad document is a `UserError` naming it.

    Args:
        text: the JSON text.
        what: the file (and line) it came from, for the message.

    Returns:
        The parsed value.

    Raises:
        UserError: not JSON, or with ``NaN``/``Infinity``.

    Examples:
        >>> loads_strict('{"loss": 0.5}', "metrics.jsonl line 1")
        {'loss': 0.5}
    """
    try:
        return json.loads(text, parse_constant=_no_constant)
    except ValueError as err:
        raise UserError(f"{what}: {err}") from None


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{path}: unreadable ({getattr(err, 'strerror', None) or err})") from None


def _read_object(path: Path) -> dict[str, Any] | None:
    text = _read_text(path)
    if text is None:
        return None
    value = loads_strict(text, str(path))
    if not isinstance(value, dict):
        raise UserError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value


def _read_metrics(path: Path) -> tuple[dict[str, Any], ...] | None:
    text = _read_text(path)
    if text is None:
        return None
    records = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        record = loads_strict(line, f"{path} line {number}")
        if not isinstance(record, dict):
            raise UserError(
                f"{path} line {number}: expected a JSON object per line, got "
                f"{type(record).__name__}"
            )
        records.append(record)
    return tuple(records)


def _plots(directory: Path) -> tuple[tuple[str, str, str], ...]:
    found = []
    for name, caption in PLOTS:
        path = directory / name
        try:
            if not path.is_file() or path.stat().st_size > _MAX_PLOT_BYTES:
                continue
            data = path.read_bytes()
        except OSError:
            continue
        if data.startswith(b"\x89PNG\r\n\x1a\n"):
            found.append((name, caption, base64.b64encode(data).decode("ascii")))
    return tuple(found)


def collect(run_dir: str | Path, marker: Mapping[str, Any] | None = None) -> RunData:
    """Read every artifact of ``run_dir``.

    Args:
        run_dir: the run directory.
        marker: its marker, if the caller read it already (else read here).

    Returns:
        The `RunData`.

    Raises:
        UserError: not a directory; neither ``metrics.jsonl`` nor ``summary.json`` there;
            a file that is not strict JSON.
    """
    path = Path(run_dir)
    if not path.is_dir():
        raise UserError(f"RUN_DIR {path}: no such directory")
    metrics = _read_metrics(path / "metrics.jsonl")
    summary = _read_object(path / "summary.json")
    if metrics is None and summary is None:
        raise UserError(
            f"RUN_DIR {path}: no metrics there (neither metrics.jsonl nor summary.json); "
            "give the --out (or --run-dir) directory of a jaxwise run"
        )
    if marker is None:
        marker = _read_object(path / ".jaxwise-run.json")
    watch = _read_object(path / "watch.json")
    return RunData(path, marker, summary, metrics or (), watch, _plots(path))


def finite_number(value: Any) -> float | None:
    """``value`` as a float if it is a finite JSON number (not a bool), else ``None``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None

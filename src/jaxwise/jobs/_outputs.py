"""Where jobs write: directories they own, files never overwritten by surprise, atomic writes.

A job directory (``--out``/``--run-dir``) may hold other files: jaxwise writes only its own
names there, and only after checking that none of them exists unless jaxwise wrote it
(the names it wrote are listed in ``.jaxwise-run.json``). A single output file
(``label-errors --out``, ``predict --out``) is never replaced unless ``--force`` is given.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from jaxwise._checks import UserError

MARKER = ".jaxwise-run.json"

__all__ = ["MARKER", "RunDir", "check_output_file", "write_csv"]


class RunDir:
    """A directory a job writes its own named outputs into.

    Args:
      path: the directory (created if missing).
      option: the command-line option that named it (for messages), e.g. ``"--out"``.
      names: every file or directory name the job may write there.
      job: the job's name, recorded in the marker.
    """

    def __init__(
        self, path: str | os.PathLike[str], option: str, names: Iterable[str], job: str
    ) -> None:
        self.path = Path(path)
        self.option = option
        self.names = frozenset(names)
        self.job = job
        self.written: set[str] = set()

    def claim(self) -> RunDir:
        """Create the directory; check it is writable and that no name of ours is someone else's."""
        if self.path.exists() and not self.path.is_dir():
            raise UserError(f"{self.option} {self.path}: is a file, expected a directory")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            probe = self.path / ".jaxwise-write-test"
            probe.write_text("ok")
            probe.unlink()
        except OSError as err:
            raise UserError(
                f"{self.option} {self.path}: not writable ({err.strerror or err})"
            ) from None
        self.written = self._read_marker()
        for name in sorted(self.names):
            if (self.path / name).exists() and name not in self.written:
                raise UserError(
                    f"{self.option} {self.path}: {name} exists and was not written by jaxwise; "
                    f"choose another {self.option} or move it away"
                )
        return self

    def _read_marker(self) -> set[str]:
        try:
            data = json.loads((self.path / MARKER).read_text())
            return {str(n) for n in data.get("files", [])}
        except (OSError, ValueError, AttributeError):
            return set()

    def __truediv__(self, name: str) -> Path:
        """The path of one of our names, recorded as written by jaxwise (before it is written)."""
        if name not in self.names:
            raise ValueError(f"{name!r} is not one of this job's output names {sorted(self.names)}")
        if name not in self.written:
            self.written.add(name)
            tmp = self.path / f".{MARKER}.tmp"
            tmp.write_text(json.dumps({"job": self.job, "files": sorted(self.written)}))
            os.replace(tmp, self.path / MARKER)
        return self.path / name


def check_output_file(path: str | os.PathLike[str], option: str, force: bool) -> Path:
    """An output path, checked before any work: no directory, no overwrite unless ``force``."""
    target = Path(path)
    if target.is_dir():
        raise UserError(f"{option} {target}: is a directory, expected a file name")
    if target.exists() and not force:
        raise UserError(f"{option} {target}: the file exists; pass --force to replace it")
    parent = target.parent if str(target.parent) else Path(".")
    try:
        parent.mkdir(parents=True, exist_ok=True)
        probe = parent / f".{target.name}.jaxwise-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UserError(f"{option} {target}: not writable ({err.strerror or err})") from None
    return target


def write_csv(path: Path, rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> Path:
    """Write ``rows`` atomically (a temporary file renamed into place); floats to 6 digits."""
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(columns))
        writer.writeheader()
        for row in rows:
            writer.writerow(
                {k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()}
            )
    os.replace(tmp, path)
    return path

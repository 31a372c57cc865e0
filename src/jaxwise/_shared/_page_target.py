"""Where a page (``jaxwise report``, ``watch --html``) may be written, checked before the work.

Shared by ``jaxwise.report`` (which writes pages) and ``jaxwise.watch`` (which checks its
``--html`` target before the script runs); neither reaches into the other's modules.
"""

from __future__ import annotations

from pathlib import Path

from jaxwise._errors import UserError
from jaxwise._shared._atomic import probe_writable

__all__ = ["GENERATOR", "check_output", "is_report"]

GENERATOR = "jaxwise report"  # the page's <meta name="generator">: how a report is recognised


def is_report(path: Path) -> bool:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as f:
            head = f.read(4096)
    except OSError:
        return False
    return f'<meta name="generator" content="{GENERATOR}">' in head


def check_output(path: Path, option: str) -> None:
    """Refuse, by ``option`` and ``path``, a page target that cannot (or must not) be written.

    Called before the work whose result goes there (``watch --html`` checks before the
    script runs).

    Raises:
        UserError: ``path`` a directory, in a missing directory, an existing file that is not
            a jaxwise report, or in a directory that refuses a new file.
    """
    if path.is_dir():
        raise UserError(f"{option} {path}: is a directory, expected a file name")
    if path.exists() and not is_report(path):
        raise UserError(
            f"{option} {path}: the file exists and is not a jaxwise report; choose another "
            f"{option} or move it away"
        )
    if not path.parent.is_dir():
        raise UserError(f"{option} {path}: the directory {path.parent} does not exist")
    try:
        probe_writable(path)
    except OSError as err:
        raise UserError(f"{option} {path}: not writable ({err.strerror or err})") from None

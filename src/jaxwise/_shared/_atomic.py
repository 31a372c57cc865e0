"""Atomic file writes: the one way jaxwise replaces a file (report pages, plots, metric logs).

The content is written to a temporary file beside the target (same directory, so the same
file system: ``.NAME.PID.RANDOM.tmp``) and renamed over it with ``os.replace``, which is atomic:
a reader sees the old file or the new one, never half of one, and an interrupted or failed
write leaves the old file untouched and no temporary file behind. A failure is an
``OSError`` naming the target (a full disk: ``ENOSPC``, see `jaxwise._shared._disk`).

Examples:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "page.html"
    >>> _ = atomic_write_text(path, "<p>hi</p>")
    >>> path.read_text(), sorted(p.name for p in path.parent.iterdir())
    ('<p>hi</p>', ['page.html'])
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

from jaxwise._shared._disk import naming

__all__ = ["atomic_write", "atomic_write_text", "probe_writable", "temporary_name"]


def temporary_name(path: Path) -> Path:
    """A fresh temporary file name beside ``path`` (hidden, unique per process and call).

    Args:
        path: the target.

    Returns:
        ``path``'s directory / ``.NAME.PID.RANDOM.tmp``.
    """
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")


def probe_writable(path: str | os.PathLike[str]) -> None:
    """Check that `atomic_write` can create ``path``'s temporary file (and remove it).

    Done before long work whose result goes to ``path``, so that an unwritable target is
    found first.

    Args:
        path: the file that will be written.

    Raises:
        OSError: the directory refuses a new file; it names ``path`` (never the temporary
            file), with the system's reason (``EACCES``, ``EROFS``, ``ENOSPC``...).
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        with open(tmp, "x", encoding="utf-8"):
            pass
    except OSError as err:
        raise naming(err, path) from None
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object]) -> Path:
    """Replace ``path`` atomically with what ``write(temporary_path)`` writes.

    Args:
        path: the file to create or replace.
        write: writes the whole content to the path it is given (e.g. ``fig.savefig``,
            ``Path.write_text``).

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OSError: the write or the rename failed; it names ``path`` (not the temporary file),
            ``errno.ENOSPC`` for a full disk. The temporary file is removed and an existing
            ``path`` is untouched.
    """
    path = Path(path)
    tmp = temporary_name(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        raise naming(err, path) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Replace ``path`` atomically with ``text`` (UTF-8).

    Args:
        path: the file to create or replace.
        text: its whole content.

    Returns:
        ``path`` as a ``Path``.

    Raises:
        OSError: as for `atomic_write`.
    """
    return atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))

"""Disk-full detection: the one place that decides whether an error is a full disk.

A full disk (or an exhausted quota) reaches jaxwise in three forms: an ``OSError`` with
``errno.ENOSPC``/``errno.EDQUOT``; another exception raised from one (``__cause__`` or
``__context__``); or a library's error that only says so in its text (orbax/TensorStore write
``"No space left on device"`` or ``[os_error_code='28']``). `is_disk_full` recognises all of
them; `disk_full_error` and `naming` build the one error jaxwise raises for it: an
``OSError(ENOSPC)`` whose ``filename`` is the file or directory the user asked for.

Examples:
    >>> import errno
    >>> is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    True
    >>> err = naming(OSError(errno.EDQUOT, "Disk quota exceeded"), "out.csv")
    >>> err.errno == errno.EDQUOT, err.strerror, err.filename
    (True, 'No space left on device', 'out.csv')
"""

from __future__ import annotations

import errno
import os

__all__ = ["FULL", "disk_full_error", "is_disk_full", "naming"]

FULL = (errno.ENOSPC, errno.EDQUOT)
"""The ``errno`` values of a full disk or an exhausted quota."""
_TEXTS = ("No space left on device", "os_error_code='28'")  # orbax's / TensorStore's words


def is_disk_full(err: BaseException) -> bool:
    """True when ``err``, or an exception it was raised from, is a full disk or quota.

    Args:
        err: any exception.

    Returns:
        Whether it (or its ``__cause__``/``__context__`` chain) is an ``OSError`` with
        ``errno`` in `FULL`, or says ``"No space left on device"`` in its text.
    """
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in FULL:
            return True
        text = str(current)
        if any(marker in text for marker in _TEXTS):
            return True
        current = current.__cause__ or current.__context__
    return False


def disk_full_error(
    path: str | os.PathLike[str], detail: str = "", code: int = errno.ENOSPC
) -> OSError:
    """The error jaxwise raises for a full disk: ``OSError(code)`` naming ``path``.

    Args:
        path: the file or directory that could not be written (what the user named).
        detail: added to the message, e.g. ``" (the checkpoint needs about 3 MB, 1 MB free)"``.
        code: the ``errno`` (``ENOSPC``, or ``EDQUOT`` for a quota).

    Returns:
        ``OSError(code, "No space left on device" + detail, str(path))``.
    """
    return OSError(code, f"No space left on device{detail}", os.fspath(path))


def naming(err: OSError, path: str | os.PathLike[str]) -> OSError:
    """``err`` re-made to name ``path`` (not a temporary file): what a failed write raises.

    A full disk becomes `disk_full_error` (its ``errno`` kept); another error keeps its
    ``errno`` and message. An error without an ``errno`` is returned unchanged.

    Args:
        err: the error of the write.
        path: the file the user asked for.

    Returns:
        The error to raise.
    """
    if err.errno is None:
        return err
    if err.errno in FULL:
        return disk_full_error(path, code=err.errno)
    return OSError(err.errno, err.strerror, os.fspath(path))

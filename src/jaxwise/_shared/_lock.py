"""File locks that name their holder: the process id, the host and the command.

The ground floor (no JAX, no other jaxwise module). A lock is an ``flock`` on a small file:
the operating system releases it when its holder exits, even on ``SIGKILL``, so a lock is
never left held by a dead process. The exclusive holder writes who it is into the file and
clears it on release, so a file that still names a holder when the lock is free was left
by a process that ended without releasing it (a *stale* lock): `FileLock.acquire`
takes it over and returns that holder, for the caller to say so.

>>> import tempfile, pathlib
>>> path = pathlib.Path(tempfile.mkdtemp()) / ".lock"
>>> with FileLock(path) as first:
...     try:
...         FileLock(path).acquire()
...     except LockHeld as err:
...         print(err.holder["pid"] == os.getpid())
True
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from jaxwise._errors import JaxwiseError

__all__ = ["FileLock", "LockHeld", "describe_holder", "set_command"]

_COMMAND: list[str] = []


def set_command(argv: list[str]) -> None:
    """Record the command line that locks name (the CLI calls this with ``jaxwise ...``)."""
    _COMMAND[:] = [str(a) for a in argv]


def _me() -> dict[str, Any]:
    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    if program in ("", "-c", "-m"):
        program = f"python {program}".strip()
    command = " ".join(_COMMAND or [program, *sys.argv[1:]])
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command if len(command) <= 160 else command[:159] + "…",
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def describe_holder(holder: dict[str, Any] | None) -> str:
    """``process 1234 on host h (jaxwise train ...)``, or a vaguer phrase when unknown.

    >>> describe_holder({"pid": 7, "host": "h", "command": "jaxwise train d.csv"})
    'process 7 on host h (jaxwise train d.csv)'
    >>> describe_holder(None)
    'another process (it did not say which)'
    """
    if not holder or "pid" not in holder:
        return "another process (it did not say which)"
    text = f"process {holder['pid']}"
    if holder.get("host"):
        text += f" on host {holder['host']}"
    if holder.get("command"):
        text += f" ({holder['command']})"
    return text


class LockHeld(JaxwiseError):
    """The lock is held by another process; ``holder`` says who (or None when it is unknown)."""

    def __init__(self, path: Path, holder: dict[str, Any] | None) -> None:
        super().__init__(f"{path} is locked by {describe_holder(holder)}")
        self.path = path
        self.holder = holder


def _read_holder(fd: int) -> dict[str, Any] | None:
    raw = os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()
    if not raw:
        return None
    try:
        holder = json.loads(raw)
    except ValueError:
        return {"pid": raw[:20]}  # an older jaxwise wrote the bare pid
    return holder if isinstance(holder, dict) else None


class FileLock:
    """A non-blocking ``flock`` on ``path``: exclusive (one writer) or shared (readers).

    Args:
        path: the lock file (created if missing, unless ``create=False``).
        shared: take a shared lock (many readers; no exclusive holder at the same time).
        remove: delete the lock file on release (for a lock beside a user's output file).
        create: create the lock file when it does not exist (``False``: no lock is taken then,
            `acquire` returns None and `held` stays False).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        shared: bool = False,
        remove: bool = False,
        create: bool = True,
    ) -> None:
        self.path = Path(path)
        self.shared = shared
        self.remove = remove
        self.create = create
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> dict[str, Any] | None:
        """Take the lock, or raise `LockHeld` at once; return a stale holder's record.

        Returns:
            The record of a process that held the lock exclusively and ended without
            releasing it (taken over now), else None.
        """
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already locked by this FileLock")
        flags = os.O_RDWR | os.O_CLOEXEC | (os.O_CREAT if self.create else 0)
        while True:
            try:
                fd = os.open(self.path, flags, 0o644)
            except FileNotFoundError:
                if self.create:
                    raise
                return None
            try:
                fcntl.flock(fd, (fcntl.LOCK_SH if self.shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read_holder(fd)
                os.close(fd)
                raise LockHeld(self.path, holder) from None
            try:  # a holder with remove=True may have unlinked the file meanwhile: retry
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
            if not self.create:
                return None
        self._fd = fd
        if self.shared:
            return None
        stale = _read_holder(fd)
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_me()).encode(), 0)
        except OSError:  # a full disk: the lock holds all the same, it just names no one
            pass
        return stale

    def release(self) -> None:
        """Release the lock (idempotent); the exclusive holder clears its record first."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            if not self.shared:
                if self.remove:
                    self.path.unlink(missing_ok=True)
                else:
                    os.ftruncate(fd, 0)
        except OSError:
            pass
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)

    def __enter__(self) -> FileLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

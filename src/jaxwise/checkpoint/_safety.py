"""What keeps a checkpoint write safe: disk space, signals, leftovers and orbax's stray noise.

- A step is only started when the disk has room for it (an estimate from the arrays'
  sizes); a full disk met anyway is one ``OSError(ENOSPC)`` naming the step, with orbax's
  temporary directory removed and every earlier step untouched.
- ``SIGINT``/``SIGTERM`` arriving during a write (or a read) are held until it is complete,
  then delivered: Ctrl-C never interrupts orbax half-way, so no background thread is left
  writing while the interpreter shuts down.
- orbax's own temporary directories (``<step>.orbax-checkpoint-tmp*``) left by a crash are
  never taken for steps; the writer removes them when it takes the directory.
- Tensorstore callbacks that fire after orbax closed its event loop (a failed read or write)
  raise ``RuntimeError('Event loop is closed')`` in a background thread, and the coroutines
  of a failed write raise when they are collected; both are reported through
  ``sys.unraisablehook``, and those exact, harmless reports are dropped (everything else
  passes).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise._shared._disk import disk_full_error

TMP_MARK = ".orbax-checkpoint-tmp"
TMP_MARKS = (TMP_MARK, ".jaxwise-tmp")  # orbax's temporary directories, and jaxwise's
_FILE_OVERHEAD = 8192  # per file: blocks of the file system, orbax's small metadata files


# ----------------------------------------------------------------------------- disk space


def _local_bytes(leaf: Any) -> int:
    shards = getattr(leaf, "addressable_shards", None)
    if shards is not None:
        return sum(int(s.data.nbytes) for s in shards if s.replica_id == 0)
    return int(np.asarray(leaf).nbytes)


def needed_bytes(tree: Any, document_bytes: int) -> int:
    """A generous estimate of the bytes this process writes for one step of ``tree``."""
    leaves = jax.tree.leaves(tree)
    data = sum(_local_bytes(leaf) for leaf in leaves)
    return int(data * 1.05) + 4 * document_bytes + (32 + 2 * len(leaves)) * _FILE_OVERHEAD


def free_bytes(path: Path) -> int:
    """Bytes available to this user on the file system that holds (or will hold) ``path``."""
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    stat = os.statvfs(probe)
    return stat.f_bavail * stat.f_frsize


def _megabytes(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def check_space(target: Path, needed: int) -> None:
    """``OSError(ENOSPC)`` naming ``target`` when the disk has less room than ``needed``."""
    free = free_bytes(target)
    if free < needed:
        raise disk_full_error(
            target,
            f" (the checkpoint needs about {_megabytes(needed)}, {_megabytes(free)} free)",
        )


def remove_leftovers(root: Path, step: int | None = None) -> list[str]:
    """Delete the temporary directories of writes under ``root`` (one ``step``'s, or all)."""
    if not root.is_dir():
        return []
    prefixes = ("",) if step is None else tuple(f"{step}{mark}" for mark in TMP_MARKS)
    removed = []
    for path in sorted(root.iterdir()):
        temporary = any(mark in path.name for mark in TMP_MARKS)
        if temporary and path.name.startswith(prefixes):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


# ----------------------------------------------------------------------------- signals


# ----------------------------------------------------------------------------- orbax's noise


def _orbax_coroutine(obj: Any) -> bool:
    code = getattr(obj, "cr_code", None)
    return code is not None and "orbax" in str(code.co_filename)


def _closed_loop_report(unraisable: Any) -> bool:
    if _orbax_coroutine(unraisable.object):
        return True  # a coroutine of a failed orbax write, closed when collected
    if not isinstance(unraisable.exc_value, RuntimeError):
        return False
    if str(unraisable.exc_value) != "Event loop is closed":
        return False
    tb = unraisable.exc_traceback
    names = []
    while tb is not None:
        names.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return "call_soon_threadsafe" in names


_HOOKED: list[Any] = []


def drop_closed_loop_reports() -> None:
    """Install (once) a ``sys.unraisablehook`` that drops tensorstore's closed-loop reports."""
    if _HOOKED and sys.unraisablehook is _HOOKED[0]:
        return
    previous = sys.unraisablehook

    def hook(unraisable: Any) -> None:
        if not _closed_loop_report(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    _HOOKED[:] = [hook]

"""SIGTERM and SIGINT in one place: SIGTERM raised as an exception, or both held over a block.

Used by the CLI (SIGTERM raises its ``_Terminated``, a ``KeyboardInterrupt``, so every
``finally`` runs), `jaxwise.train.fit` (SIGTERM raises `jaxwise.train.Terminated` after the save
in flight) and the checkpoint writers (SIGINT and SIGTERM held until a step is complete).
Handlers can only be set in the main thread: elsewhere each helper leaves signals alone.

Examples:
    >>> with sigterm_raises(KeyboardInterrupt):
    ...     pass
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

__all__ = ["raise_on_sigterm", "sigterm_raises", "signals_held"]


def raise_on_sigterm(
    error: Callable[[], BaseException], *, only_default: bool = False
) -> Callable[[], None] | None:
    """Make SIGTERM raise ``error()`` in the main thread.

    Args:
        error: makes the exception to raise (an exception class, typically).
        only_default: install only over the default handler (leave a program's own alone).

    Returns:
        A function restoring the previous handler, or ``None`` when nothing was installed (not
        the main thread, another handler with ``only_default``, or signals not settable).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    if only_default and signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        return None

    def terminate(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        raise error()

    try:
        previous = signal.signal(signal.SIGTERM, terminate)
    except (ValueError, OSError):  # not settable here (an embedded interpreter)
        return None

    def restore() -> None:
        signal.signal(signal.SIGTERM, previous)

    return restore


@contextlib.contextmanager
def sigterm_raises(
    error: Callable[[], BaseException], *, only_default: bool = False
) -> Iterator[None]:
    """Within the block, SIGTERM raises ``error()`` (see `raise_on_sigterm`); restored after."""
    restore = raise_on_sigterm(error, only_default=only_default)
    try:
        yield
    finally:
        if restore is not None:
            restore()


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT and SIGTERM until the block is done, then deliver them (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        del frame
        received.append(signum)

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, hold)
        except (ValueError, OSError):  # not settable here (an embedded interpreter)
            pass
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if received:
            signum = received[0]
            handler = previous.get(signum, signal.SIG_DFL)
            if callable(handler):
                handler(signum, None)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(signum)

"""Asynchronous saves: one in flight, written by a background thread, never lost silently.

A `SaveQueue` runs one save at a time in its own thread: submitting a second save
first waits for the one in flight (a bounded queue of one), and a failed save is kept and
raised — as a `CheckpointError` naming its step — by the next ``wait`` (which
``Checkpointer.save`` and ``close`` call).

Python starts no new thread once the interpreter shuts down, and orbax needs new threads to
write, so a save must finish while the program still runs: ``Checkpointer.close`` (or its
``with`` block) and ``jaxwise.train.fit`` wait for theirs, and an uncaught exception (Ctrl-C
included) first finishes every open writer's save, then prints its traceback. A save still
in flight when a program ends without closing its writer is reported in one line on stderr
(orbax's own log lines and tracebacks are kept off the terminal).
"""

from __future__ import annotations

import logging
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol

from jaxwise._shared._disk import is_disk_full
from jaxwise.checkpoint._format import CheckpointError

__all__ = ["SaveQueue", "drain", "track", "untrack"]


class SaveQueue:
    """One background save at a time; ``wait`` joins it and raises its error, once.

    Examples:
        >>> queue = SaveQueue()
        >>> queue.submit(7, lambda: 1 / 0)
        >>> try:
        ...     queue.wait()
        ... except CheckpointError as err:
        ...     print(err)
        the asynchronous save of step 7 failed: ZeroDivisionError: division by zero
        >>> queue.wait()  # reported once
    """

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._done = threading.Event()  # set when the save in flight has ended
        self._step: int | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        """A save was submitted and not yet waited for."""
        return self._thread is not None

    def submit(self, step: int, write: Callable[[], Any]) -> None:
        """Wait for the save in flight (raising its error), then start ``write`` in a thread."""
        self.wait()
        self._step = step
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, args=(write,), name=f"jaxwise-checkpoint-step-{step}"
        )
        self._thread.start()

    def _run(self, write: Callable[[], Any]) -> None:
        try:
            write()
        except BaseException as err:  # kept for the caller: raised by the next wait()
            self._error = err
        finally:
            self._done.set()

    def wait(self) -> None:
        """Block until the save in flight is written; a failure raises `CheckpointError`."""
        thread = self._thread
        if thread is None:
            return
        # an Event, not only join(): a join interrupted by a signal handler's exception marks
        # the thread as stopped in CPython 3.12 (bpo-45274), so a second wait would not wait
        self._done.wait()
        thread.join()
        self._thread = None
        error, self._error = self._error, None
        if isinstance(error, OSError) and is_disk_full(error):
            raise error  # a full disk: the one OSError naming the step, as a synchronous save
        if error is not None:
            raise CheckpointError(
                f"the asynchronous save of step {self._step} failed: "
                f"{type(error).__name__}: {error}"
            ) from error


class _Waitable(Protocol):
    def wait(self) -> None: ...


_OPEN: weakref.WeakSet[Any] = weakref.WeakSet()
_HOOKED = False


def track(writer: _Waitable) -> None:
    """Finish ``writer``'s save in flight on an uncaught exception and at exit (while open).

    The first call installs the hooks: an ``excepthook`` that drains before chaining to the
    previous one, and a callback run before the interpreter joins its threads.
    """
    global _HOOKED
    _OPEN.add(writer)
    if not _HOOKED:
        _HOOKED = True
        _register_before_thread_pools_stop(_drain_at_shutdown)
        sys.excepthook = _finish_saves_first(sys.excepthook)


def untrack(writer: _Waitable) -> None:
    """``writer`` is closed: nothing left to finish."""
    _OPEN.discard(writer)


def drain(*, at_shutdown: bool = False) -> None:
    """Finish every open writer's save in flight; a failure is printed (nobody is left to raise)."""
    for writer in list(_OPEN):
        try:
            writer.wait()
        except CheckpointError as err:
            hint = (
                " (the program ended with the save in flight: close the Checkpointer, or use "
                "it in a `with` block, before the program ends)"
                if at_shutdown
                else ""
            )
            print(f"jaxwise: error: {err}{hint}", file=sys.stderr)


def _drain_at_shutdown() -> None:
    logging.getLogger("absl").addFilter(_drop)  # orbax's failure records: we report ourselves
    logging.getLogger("orbax").addFilter(_drop)
    drain(at_shutdown=True)


def _drop(record: logging.LogRecord) -> bool:
    del record
    return False


def _register_before_thread_pools_stop(callback: Callable[[], None]) -> None:
    """Run ``callback`` at exit before the interpreter joins its threads.

    ``atexit`` callbacks run after the threads are joined (a failing orbax thread would
    have logged its traceback by then). ``threading._register_atexit`` (a private CPython
    hook, the one ``concurrent.futures`` itself uses) runs callbacks in reverse order of
    registration before the joins. Isolated here; ``tests/test_fit_async.py`` tells us if
    it ever disappears.
    """
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # pragma: no cover - a Python without the hook: best effort
        import atexit

        atexit.register(callback)
        return
    register(callback)


def _finish_saves_first(previous: Callable[..., Any]) -> Callable[..., Any]:
    """An ``excepthook`` that finishes the saves in flight (threads still work) and chains."""

    def excepthook(*exc_info: Any) -> Any:
        drain()
        return previous(*exc_info)

    return excepthook

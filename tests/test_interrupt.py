"""The one SIGTERM/SIGINT helper (`jaxwise._shared._interrupt`) used by the CLI, `fit` and
checkpoints."""

import os
import signal
import threading

import pytest

from jaxwise._shared._interrupt import raise_on_sigterm, signals_held, sigterm_raises


class Stop(Exception):
    pass


class Halt(KeyboardInterrupt):
    """As the CLI's SIGTERM: a ``KeyboardInterrupt``."""


def test_sigterm_raises_inside_the_block_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stop), sigterm_raises(Stop):
        os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) is before


def test_only_default_leaves_a_programs_own_handler_alone():
    seen = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    try:
        assert raise_on_sigterm(Stop, only_default=True) is None
        with sigterm_raises(Stop, only_default=True):
            os.kill(os.getpid(), signal.SIGTERM)  # the program's handler, no exception
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_outside_the_main_thread_nothing_is_installed():
    got = []
    thread = threading.Thread(target=lambda: got.append(raise_on_sigterm(Stop)))
    thread.start()
    thread.join()
    assert got == [None]


def test_signals_held_delivers_after_the_block():
    order = []
    with pytest.raises(Stop), sigterm_raises(Stop):
        with signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            order.append("block finished")
        order.append("not reached")
    assert order == ["block finished"]


def test_an_interrupted_wait_for_a_save_waits_again_then_raises():
    """A signal handler's exception inside the wait (simulated: real delivery to the main
    thread's wait is up to the OS; the CLI's signal tests send real ones) does not cut the
    save in flight short: `fit` waits again, then raises it."""
    from types import SimpleNamespace

    from jaxwise.checkpoint._async import SaveQueue
    from jaxwise.train._loop._standard_callbacks import _finish_saves

    release, written = threading.Event(), []

    def write():  # the save in flight: still writing when the wait is interrupted
        release.wait()
        written.append("step 7")

    queue, calls = SaveQueue(), []

    def wait():
        calls.append(len(written))
        if len(calls) == 1:  # the first wait is interrupted while the save is in flight
            release.set()
            raise Halt()
        queue.wait()

    queue.submit(7, write)
    with pytest.raises(Halt):
        _finish_saves(SimpleNamespace(wait=wait), None)
    assert len(calls) == 2 and calls[0] == 0  # waited again after the interruption
    assert written == ["step 7"] and not queue.busy

"""Asynchronous checkpoints in ``fit``: exact states, one save in flight, errors never lost."""

import subprocess
import sys
import textwrap
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim
from jaxwise.checkpoint import Checkpointer, CheckpointError, latest_step, restore
from jaxwise.compilation import CompileBudget
from jaxwise.train import Checkpointing, TrainState, fit, make_train_step
from jaxwise.tree import host_copy


def loss(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def host_batches(n, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(size=(8, 3)).astype(np.float32)
        out.append((x, x @ np.asarray([1.0, -2.0, 0.5], np.float32) + 0.3))
    return out


def new_state(tx):
    return TrainState.create({"w": jnp.zeros(3), "b": jnp.zeros(())}, tx, 0)


def recording(step, seen):
    """``step`` that keeps a host copy of every state it is given, by step number."""

    def wrapped(state, batch):
        seen[int(state.step)] = host_copy(state)
        return step(state, batch)

    wrapped.mesh = None  # pyright: ignore[reportFunctionMemberAccess]  # fit reads step.mesh
    return wrapped


def assert_bit_equal(a, b):
    for x, y in zip(jax.tree.leaves(host_copy(a)), jax.tree.leaves(b), strict=True):
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@pytest.fixture(autouse=True)
def orbax_writer(monkeypatch):
    """These tests gate orbax's writer (the multi-process format) to order the saves."""
    from jaxwise.checkpoint import _checkpointer

    monkeypatch.setattr(_checkpointer, "writes_natively", lambda: False)


class GatedWriter:
    """A stand-in for orbax's writer: records what happens; ``save`` waits for ``release``."""

    def __init__(self, real, *, fail_steps=()):
        self.real, self.fail_steps = real, set(fail_steps)
        self.events, self.in_flight, self.most_in_flight = [], 0, 0
        self.lock = threading.Lock()
        self.release = {}

    def gate(self, step):
        return self.release.setdefault(step, threading.Event())

    def save(self, target, args):
        step = int(target.name)
        with self.lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.events.append(("start", step))
        self.gate(step).wait()
        try:
            if step in self.fail_steps:
                raise OSError(f"disk full while writing step {step}")
            self.real.save(target, args=args)
        finally:
            with self.lock:
                self.in_flight -= 1
                self.events.append(("end", step))

    def close(self):
        self.real.close()


def test_async_fit_checkpoints_restore_exactly_the_states_at_those_steps(tmp_path):
    tx = optim.adam(0.05)
    step = make_train_step(loss)
    seen = {}
    with Checkpointer(tmp_path / "ck", keep=10) as writer:
        assert writer.async_save  # the default
        with CompileBudget(1, step, exact=True):
            final, report = fit(
                recording(step, seen),
                new_state(tx),
                host_batches(23),
                callbacks=[Checkpointing(writer, every=5)],
            )
        assert (
            writer._queue is not None and not writer._queue.busy
        )  # fit returned with its last save complete
    assert report.checkpoints == (5, 10, 15, 20, 23)
    seen[23] = host_copy(final)
    for saved in report.checkpoints:
        assert_bit_equal(restore(tmp_path / "ck", like=new_state(tx), step=saved), seen[saved])
    assert latest_step(tmp_path / "ck") == 23


def test_at_most_one_save_in_flight_and_a_second_save_waits(tmp_path):
    tx = optim.sgd(0.1)
    states = [new_state(tx).replace(step=jnp.asarray(i, jnp.int32)) for i in (1, 2)]
    writer = Checkpointer(tmp_path / "ck")
    gated = GatedWriter(writer._writer)
    writer._writer = gated
    writer.save(states[0])  # returns while step 1 is being written
    assert gated.events == [] or gated.events == [("start", 1)]
    returned = []  # what had happened when the second save returned
    second = threading.Thread(
        target=lambda: returned.append((writer.save(states[1]), list(gated.events)))
    )
    second.start()
    gated.gate(1).set()  # step 1 may finish now; only then may the second save start
    second.join()
    gated.gate(2).set()
    writer.close()
    assert gated.events == [("start", 1), ("end", 1), ("start", 2), ("end", 2)]
    assert gated.most_in_flight == 1 and ("end", 1) in returned[0][1]
    assert latest_step(tmp_path / "ck") == 2


def test_a_failed_async_save_is_raised_by_the_next_save_and_by_close(tmp_path):
    tx = optim.sgd(0.1)
    state = new_state(tx)
    writer = Checkpointer(tmp_path / "ck")
    gated = GatedWriter(writer._writer, fail_steps={1, 3})
    writer._writer = gated
    for step in (1, 2, 3):
        gated.gate(step).set()
    writer.save(state.replace(step=jnp.asarray(1, jnp.int32)))
    with pytest.raises(CheckpointError, match="save of step 1 failed: OSError: disk full"):
        writer.save(state.replace(step=jnp.asarray(2, jnp.int32)))
    writer.save(state.replace(step=jnp.asarray(2, jnp.int32)))  # reported once; goes on
    writer.save(state.replace(step=jnp.asarray(3, jnp.int32)))
    with pytest.raises(CheckpointError, match="save of step 3 failed"):
        writer.close()
    assert latest_step(tmp_path / "ck") == 2
    Checkpointer(tmp_path / "ck").close()  # the lock was released all the same


def test_fit_raises_a_failed_async_save(tmp_path):
    tx = optim.sgd(0.1)
    writer = Checkpointer(tmp_path / "ck")
    gated = GatedWriter(writer._writer, fail_steps={4})
    for step in (2, 4, 6):
        gated.gate(step).set()
    writer._writer = gated
    with pytest.raises(CheckpointError, match="step 4 failed"):
        fit(
            make_train_step(loss),
            new_state(tx),
            host_batches(6),
            callbacks=[Checkpointing(writer, every=2)],
        )
    writer.close()
    assert latest_step(tmp_path / "ck") == 2


def test_an_exception_in_the_loop_first_finishes_the_save_in_flight(tmp_path):
    tx = optim.sgd(0.1)
    step = make_train_step(loss)
    writer = Checkpointer(tmp_path / "ck")
    gated = GatedWriter(writer._writer)
    writer._writer = gated

    def interrupted(state, batch):
        if int(state.step) == 3:
            gated.gate(2).set()  # the save of step 2 is still in flight here
            raise KeyboardInterrupt
        return step(state, batch)

    with pytest.raises(KeyboardInterrupt):
        fit(interrupted, new_state(tx), host_batches(6), callbacks=[Checkpointing(writer, every=2)])
    assert gated.events == [("start", 2), ("end", 2)]  # finished before fit re-raised
    writer.close()
    assert latest_step(tmp_path / "ck") == 2


def test_the_shutdown_hook_is_still_there():
    # jaxwise.checkpoint._async relies on this private CPython hook to run before the
    # interpreter joins its threads; if it disappears, the fallback (atexit) is later.
    assert callable(getattr(threading, "_register_atexit", None))


def _run(script, tmp_path):
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )


PRELUDE = """
    import os, signal, threading
    import jax.numpy as jnp, numpy as np
    from jaxwise import optim
    from jaxwise.checkpoint import Checkpointer, _checkpointer
    from jaxwise.train import Checkpointing, TrainState, fit, make_train_step

    _checkpointer.writes_natively = lambda: False  # gate orbax's writer (multi-process format)

    def loss(p, b):
        return jnp.mean((b[0] @ p["w"] - b[1]) ** 2)

    tx = optim.sgd(0.1)
    state = TrainState.create({"w": jnp.zeros(3)}, tx, 0)
    batches = [(np.ones((4, 3), np.float32), np.ones(4, np.float32))] * 10

    def gated_writer(path):
        # a Checkpointer whose save stays in flight until someone waits for it
        release = threading.Event()

        class Writer(Checkpointer):
            def wait(self):
                if self._queue.busy:
                    release.set()
                super().wait()

        writer = Writer(path)
        real = writer._writer

        class Gated:
            def save(self, target, args):
                release.wait()
                real.save(target, args=args)

            def close(self):
                real.close()

        writer._writer = Gated()
        return writer
"""


@pytest.mark.slow
def test_sigterm_during_fit_finishes_the_save_and_exits_143(tmp_path):
    proc = _run(
        PRELUDE
        + """
    step = make_train_step(loss)

    def terminated(state, batch):
        if int(state.step) == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return step(state, batch)

    writer = Checkpointer("ck")
    fit(terminated, state, batches, callbacks=[Checkpointing(writer, every=4)])
    """,
        tmp_path,
    )
    assert proc.returncode == 143, proc.stderr
    assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr
    assert latest_step(tmp_path / "ck") == 4


@pytest.mark.slow
def test_an_uncaught_exception_first_finishes_the_save_in_flight(tmp_path):
    proc = _run(
        PRELUDE
        + """
    writer = gated_writer("ck")
    writer.save(state.replace(step=jnp.asarray(7, jnp.int32)))
    raise RuntimeError("the user's own error")
    """,
        tmp_path,
    )
    assert proc.returncode == 1
    assert "RuntimeError: the user's own error" in proc.stderr
    assert proc.stderr.count("Traceback") == 1 and "ERROR:absl" not in proc.stderr, proc.stderr
    assert latest_step(tmp_path / "ck") == 7


@pytest.mark.slow
def test_a_save_in_flight_at_the_end_of_a_program_is_reported_in_one_line(tmp_path):
    proc = _run(
        PRELUDE
        + """
    writer = gated_writer("ck")  # released only by the exit hook: orbax then starts no thread
    writer.save(state.replace(step=jnp.asarray(7, jnp.int32)))
    """,
        tmp_path,
    )
    assert proc.returncode == 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("jaxwise: error: the asynchronous save of step 7 failed")
    assert "close the Checkpointer" in lines[0]

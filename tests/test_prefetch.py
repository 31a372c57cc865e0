"""Streaming: prefetch_to_device (order, sharding, errors, overlap) and the fit loop."""

import itertools
import threading
from contextlib import nullcontext

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import host_default, mesh_devices
from jax.sharding import PartitionSpec as P

from jaxwise import optim
from jaxwise.checkpoint import Checkpointer, latest_step, load_metadata, restore
from jaxwise.compilation import CompileCounter
from jaxwise.data import prefetch_to_device
from jaxwise.sharding import data_mesh
from jaxwise.train import Checkpointing, ProgressBar, TrainState, fit, make_train_step


def loss_fn(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


TRUE_W = np.asarray([1.0, -2.0, 0.5, 3.0], np.float32)


def host_batches(n, batch=16, seed=0, nan_at=None):
    rng = np.random.default_rng(seed)
    for i in range(n):
        x = rng.normal(size=(batch, 4)).astype(np.float32)
        y = (x @ TRUE_W + 0.5).astype(np.float32)
        if i == nan_at:
            x = np.full_like(x, np.nan)
        yield x, y


def new_state(tx):
    return TrainState.create({"w": jnp.zeros(4), "b": jnp.zeros(())}, tx, 0)


def test_prefetch_keeps_order_and_puts_batches_on_device():
    batches = list(host_batches(5))
    with prefetch_to_device(iter(batches), size=2) as feed:
        got = list(feed)
    assert len(got) == 5
    for (x, y), (hx, hy) in zip(got, batches):
        assert isinstance(x, jax.Array) and isinstance(y, jax.Array)
        np.testing.assert_array_equal(np.asarray(x), hx)
        np.testing.assert_array_equal(np.asarray(y), hy)


def test_prefetch_shards_over_the_data_axis():
    mesh = data_mesh(mesh_devices(4))
    with prefetch_to_device(host_batches(3), mesh=mesh) as feed:
        for x, y in feed:
            assert x.sharding.spec == P("data") and len(x.sharding.device_set) == 4
            assert y.sharding.spec == P("data")


def test_prefetch_reraises_the_source_error_after_earlier_batches():
    def broken():
        yield np.ones(2)
        raise RuntimeError("disk on fire")

    feed = prefetch_to_device(broken(), size=3)
    assert float(next(feed).sum()) == 2.0
    with pytest.raises(RuntimeError, match="disk on fire"):
        next(feed)


def test_prefetch_close_stops_the_thread_early():
    def endless():
        while True:
            yield np.zeros(3)

    feed = prefetch_to_device(endless(), size=2)
    next(feed)
    thread = feed._thread
    feed.close()
    thread.join(timeout=60)  # close() joins for a bounded time; this bound only avoids a hang
    assert not thread.is_alive()
    with pytest.raises(StopIteration):
        next(feed)


def test_prefetch_bad_arguments():
    with pytest.raises(ValueError, match="`size` must be >= 1"):
        prefetch_to_device([], size=0)
    with pytest.raises(TypeError, match="`size` must be an int"):
        prefetch_to_device([], size=2.0)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`iterator` must be an iterable"):
        prefetch_to_device(3)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`mesh` must be a jax.sharding.Mesh"):
        prefetch_to_device([], mesh="data")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="axis named 'data'"):
        prefetch_to_device([], mesh=jax.sharding.Mesh(np.asarray(mesh_devices(2)), ("batch",)))


class Handshake:
    """Whether batch ``i + 1`` was already prepared when step ``i`` ran: events, not clocks.

    The generator sets ``made[i]`` when it has prepared batch ``i``. Without prefetching,
    step ``i`` only looks (the generator runs in the same thread, after the step); with it,
    step ``i`` waits for ``made[i + 1]``, which the background thread sets while the step
    is running (the queue always has room for one more batch), so the wait returns at once
    whatever the machine's load. The timeout only turns a broken prefetcher (one that never
    runs ahead) into a failure instead of a hang.
    """

    def __init__(self, n):
        self.made = [threading.Event() for _ in range(n)]
        self.ready = []

    def batches(self):
        for i, batch in enumerate(host_batches(len(self.made))):
            self.made[i].set()
            yield batch

    def step(self, step, *, wait):
        count = itertools.count()

        def run(state, batch):
            i = next(count)
            if i + 1 < len(self.made):
                upcoming = self.made[i + 1]
                self.ready.append(upcoming.wait(timeout=60) if wait else upcoming.is_set())
            return step(state, batch)

        return run


def test_prefetch_prepares_the_next_batch_while_a_step_runs():
    tx = optim.sgd(0.05)
    step = make_train_step(loss_fn)
    n = 6
    for prefetch in (0, 2):
        handshake = Handshake(n)
        _, report = fit(
            handshake.step(step, wait=bool(prefetch)),
            new_state(tx),
            handshake.batches(),
            prefetch=prefetch,
        )
        assert report.steps == n
        # without prefetch batch i+1 is made only after step i; with it, during step i
        assert handshake.ready == [bool(prefetch)] * (n - 1)


def test_fit_compiles_once_counts_skipped_steps_and_matches_a_manual_loop():
    tx = optim.adam(0.05)
    step = make_train_step(loss_fn)
    with CompileCounter(step) as counter:
        state, report = fit(step, new_state(tx), host_batches(30, nan_at=4))
    assert counter.count == 1
    assert report.steps == 30 and report.skipped == 1 and int(state.step) == 29
    assert np.isnan(report.losses[4]) and report.losses[-1] < report.losses[0]

    manual = new_state(tx)
    for batch in host_batches(30, nan_at=4):
        manual, _ = step(manual, batch)
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.asarray(manual.params["w"]))


def test_fit_on_a_mesh_uses_the_prefetched_sharded_batches():
    tx = optim.adam(0.05)
    mesh = data_mesh(mesh_devices(4))
    step = make_train_step(loss_fn, mesh=mesh)
    with CompileCounter(step) as counter:
        state, report = fit(step, new_state(tx), host_batches(12))
    assert counter.count == 1 and report.steps == 12
    # the single-device baseline on the mesh's own backend (a one-chip TPU's mesh is the CPU's)
    same_backend = host_default() if mesh.devices.flat[0].platform == "cpu" else nullcontext()
    with same_backend:
        single, _ = fit(make_train_step(loss_fn), new_state(tx), host_batches(12))
    np.testing.assert_allclose(
        np.asarray(state.params["w"]), np.asarray(single.params["w"]), rtol=1e-5
    )


def test_fit_checkpoints_every_n_steps_and_resumes(tmp_path):
    tx = optim.adam(0.05)
    step = make_train_step(loss_fn)
    ck = tmp_path / "ck"
    with Checkpointer(ck, keep=5) as checkpointer:
        state, report = fit(
            step,
            new_state(tx),
            host_batches(10),
            callbacks=[Checkpointing(checkpointer, every=4, metadata={"run": "a"})],
        )
    assert report.checkpoints == (4, 8, 10) and latest_step(ck) == 10
    # fit keeps its count, the state's step and the hash chained over the batches trained
    meta = load_metadata(ck, step=4)
    assert meta["run"] == "a" and set(meta["fit"]) == {"batches", "step", "trained"}
    assert (meta["fit"]["batches"], meta["fit"]["step"], meta["fit"]["trained"]["to"]) == (4, 4, 4)

    straight, _ = fit(step, new_state(tx), host_batches(16))
    batches = host_batches(16)
    with Checkpointer(tmp_path / "r") as checkpointer:
        first, _ = fit(
            step, new_state(tx), batches, steps=7, callbacks=[Checkpointing(checkpointer)]
        )
    resumed = restore(tmp_path / "r", like=new_state(tx))
    resumed, report = fit(step, resumed, batches)
    assert report.steps == 9 and int(resumed.step) == 16
    np.testing.assert_array_equal(np.asarray(resumed.params["w"]), np.asarray(straight.params["w"]))


def test_fit_progress_bar_shows_loss_and_skipped(capsys):
    tx = optim.sgd(0.01)
    fit(
        make_train_step(loss_fn),
        new_state(tx),
        host_batches(5, nan_at=1),
        steps=3,
        callbacks=[ProgressBar()],
    )
    err = capsys.readouterr().err
    assert "train" in err and "3/3" in err and "skipped 1" in err


class _Keep:
    def save(self, state, metadata=None):
        pass


def test_fit_bad_arguments(tmp_path):
    tx = optim.sgd(0.01)
    step = make_train_step(loss_fn)
    with pytest.raises(TypeError, match="`state` must be a TrainState"):
        fit(step, {"w": 1}, [])  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`program` must be callable"):
        fit(3, new_state(tx), [])  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`steps` must be >= 1"):
        fit(step, new_state(tx), [], steps=0)
    with pytest.raises(ValueError, match="`every` must be >= 1"):
        Checkpointing(_Keep(), every=0)
    with pytest.raises(TypeError, match="`checkpointer` must be a jaxwise.checkpoint.Checkpointer"):
        Checkpointing(str(tmp_path))  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="a second Checkpointing"):
        fit(step, new_state(tx), [], callbacks=[ProgressBar(), *[Checkpointing(_Keep())] * 2])
    with pytest.raises(TypeError, match="`batches` must be an iterable"):
        fit(step, new_state(tx), 5)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`prefetch` must be >= 0"):
        fit(step, new_state(tx), [], prefetch=-1)

"""Streaming: prefetch_to_device (order, sharding, errors, overlap) and the fit loop."""

import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from jaxwise import optim
from jaxwise.checkpoint import Checkpointer, latest_step, load_metadata, restore
from jaxwise.compilation import CompileCounter
from jaxwise.data import prefetch_to_device
from jaxwise.sharding import data_mesh
from jaxwise.train import TrainState, fit, make_train_step


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
    mesh = data_mesh(jax.devices()[:4])
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
    feed.close()
    assert not any(t.name == "jaxwise-prefetch" and t.is_alive() for t in threading.enumerate())
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
        prefetch_to_device([], mesh="data")
    with pytest.raises(ValueError, match="axis named 'data'"):
        prefetch_to_device([], mesh=jax.sharding.Mesh(np.asarray(jax.devices()[:2]), ("batch",)))


class Timeline:
    """Events from the producer thread and the training loop, in the order they happened."""

    def __init__(self):
        self.events, self._lock = [], threading.Lock()

    def log(self, kind, i):
        with self._lock:
            self.events.append((kind, i))

    def slow_batches(self, n, seconds):
        for i, batch in enumerate(host_batches(n)):
            time.sleep(seconds)  # preparing a batch takes time on the host
            self.log("made", i)
            yield batch

    def slow_step(self, step, seconds):
        count = iter(range(10**6))

        def run(state, batch):
            i = next(count)
            out = step(state, batch)
            jax.block_until_ready(out)
            time.sleep(seconds)  # the device is busy
            self.log("trained", i)
            return out

        run.mesh = None
        return run

    def overlapped(self):
        """Steps i during which batch i+1 was already prepared (host and device overlapped)."""
        pos = {event: k for k, event in enumerate(self.events)}
        n = sum(kind == "trained" for kind, _ in self.events)
        return sum(pos[("made", i + 1)] < pos[("trained", i)] for i in range(n - 1))


def test_prefetch_overlaps_a_slow_generator_with_a_slow_step():
    tx = optim.sgd(0.05)
    step = make_train_step(loss_fn, tx)
    n = 8
    runs = {}
    for prefetch in (0, 2):
        timeline = Timeline()
        _, report = fit(
            timeline.slow_step(step, 0.04),
            new_state(tx),
            timeline.slow_batches(n, 0.04),
            prefetch=prefetch,
            progress=False,
        )
        assert report.steps == n
        runs[prefetch] = timeline.overlapped()
    assert runs[0] == 0  # without prefetch, batch i+1 is only made after step i
    assert runs[2] >= n // 2  # with it, the next batch is ready while the step runs


def test_fit_compiles_once_counts_skipped_steps_and_matches_a_manual_loop():
    tx = optim.adam(0.05)
    step = make_train_step(loss_fn, tx)
    with CompileCounter(step) as counter:
        state, report = fit(step, new_state(tx), host_batches(30, nan_at=4), progress=False)
    assert counter.count == 1
    assert report.steps == 30 and report.skipped == 1 and int(state.step) == 29
    assert np.isnan(report.losses[4]) and report.losses[-1] < report.losses[0]

    manual = new_state(tx)
    for batch in host_batches(30, nan_at=4):
        manual, _ = step(manual, batch)
    np.testing.assert_array_equal(np.asarray(state.params["w"]), np.asarray(manual.params["w"]))


def test_fit_on_a_mesh_uses_the_prefetched_sharded_batches():
    tx = optim.adam(0.05)
    mesh = data_mesh(jax.devices()[:4])
    step = make_train_step(loss_fn, tx, mesh=mesh)
    with CompileCounter(step) as counter:
        state, report = fit(step, new_state(tx), host_batches(12), progress=False)
    assert counter.count == 1 and report.steps == 12
    single, _ = fit(make_train_step(loss_fn, tx), new_state(tx), host_batches(12), progress=False)
    np.testing.assert_allclose(
        np.asarray(state.params["w"]), np.asarray(single.params["w"]), rtol=1e-5
    )


def test_fit_checkpoints_every_n_steps_and_resumes(tmp_path):
    tx = optim.adam(0.05)
    step = make_train_step(loss_fn, tx)
    ck = tmp_path / "ck"
    with Checkpointer(ck, keep=5) as checkpointer:
        state, report = fit(
            step,
            new_state(tx),
            host_batches(10),
            checkpointer=checkpointer,
            checkpoint_every=4,
            metadata={"run": "a"},
            progress=False,
        )
    assert report.checkpoints == (4, 8, 10) and latest_step(ck) == 10
    assert load_metadata(ck, step=4) == {"run": "a"}

    straight, _ = fit(step, new_state(tx), host_batches(16), progress=False)
    batches = host_batches(16)
    with Checkpointer(tmp_path / "r") as checkpointer:
        first, _ = fit(
            step, new_state(tx), batches, steps=7, checkpointer=checkpointer, progress=False
        )
    resumed = restore(tmp_path / "r", like=new_state(tx))
    resumed, report = fit(step, resumed, batches, progress=False)
    assert report.steps == 9 and int(resumed.step) == 16
    np.testing.assert_array_equal(np.asarray(resumed.params["w"]), np.asarray(straight.params["w"]))


def test_fit_progress_bar_shows_loss_and_skipped(capsys):
    tx = optim.sgd(0.01)
    fit(
        make_train_step(loss_fn, tx),
        new_state(tx),
        host_batches(5, nan_at=1),
        steps=3,
        progress=True,
    )
    err = capsys.readouterr().err
    assert "train" in err and "3/3" in err and "skipped 1" in err


def test_fit_bad_arguments(tmp_path):
    tx = optim.sgd(0.01)
    step = make_train_step(loss_fn, tx)
    with pytest.raises(TypeError, match="`state` must be a TrainState"):
        fit(step, {"w": 1}, [])  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`step` must be callable"):
        fit(3, new_state(tx), [])  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`steps` must be >= 1"):
        fit(step, new_state(tx), [], steps=0)
    with pytest.raises(ValueError, match="`checkpoint_every` needs `checkpointer`"):
        fit(step, new_state(tx), [], checkpoint_every=2)
    with pytest.raises(TypeError, match="`checkpointer` must be a jaxwise.checkpoint.Checkpointer"):
        fit(step, new_state(tx), [], checkpointer=str(tmp_path))  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`batches` must be an iterable"):
        fit(step, new_state(tx), 5)  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`prefetch` must be >= 0"):
        fit(step, new_state(tx), [], prefetch=-1)

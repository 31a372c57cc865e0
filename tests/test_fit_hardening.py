"""`fit` never loses a checkpoint to a metric writer, reads only scalar metrics, and never
resumes silently over other data or an iterator it cannot move (#43)."""

from __future__ import annotations

import itertools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim, privacy, train


def _data():
    x = jnp.asarray(np.random.default_rng(0).normal(size=(8, 3)), jnp.float32)
    return x, x.sum(1)


def _mean_loss(p, batch):
    x, y = batch
    return jnp.mean((x @ p["w"] - y) ** 2)


class _Saver:
    def __init__(self):
        self.steps = []

        self.metadata = []

    def save(self, tree, metadata=None):
        self.steps.append(int(tree.step))
        self.metadata.append(metadata)


class _BrokenFlush:
    def __init__(self):
        self.written = []

    def write(self, step, scalars):
        self.written.append((step, dict(scalars)))

    def flush(self) -> None:
        raise ValueError("Invalid metric name: 'acc@1'")

    def close(self):
        pass


def test_a_writer_that_fails_to_flush_never_costs_the_checkpoint():
    state = train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0))
    saver, writer = _Saver(), _BrokenFlush()
    step = train.make_step(train.value_and_grad(_mean_loss))
    with pytest.raises(ValueError, match="acc@1") as caught:
        callbacks = [train.Checkpointing(saver, every=2), train.MetricLogging([writer])]
        train.fit(step, state, [_data()] * 4, callbacks=callbacks)
    assert saver.steps == [2]  # saved before the writer's error was raised
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "_BrokenFlush's flush()" in notes and "saved the checkpoint of step 2 first" in notes


def test_an_aux_dict_is_not_a_scalar_metric():
    def loss(p, batch):
        value = _mean_loss(p, batch)
        return value, {"mse": value}

    writer = _BrokenFlush()
    writer.flush = lambda: None  # a writer that works
    state = train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0))
    step = train.make_step(train.value_and_grad(loss, has_aux=True))
    _, report = train.fit(step, state, [_data()] * 3, callbacks=[train.MetricLogging([writer])])
    assert report.steps == 3 and np.isfinite(report.losses).all()
    assert all("aux" not in scalars and "loss" in scalars for _, scalars in writer.written)


def test_a_dp_step_without_a_loss_trains_through_fit():
    def loss(p, example):
        x, y = example
        return (x @ p["w"] - y) ** 2

    gradient = privacy.dp_gradient_fn(loss, clip_norm=1.0, noise_multiplier=1.0)
    state = train.TrainState.create(
        {"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0), gradient=gradient
    )
    state, report = train.fit(train.make_step(gradient), state, [_data()] * 3)
    assert report.steps == 3 and int(state.step) == 3
    assert np.isnan(report.losses).all()  # a DP gradient reports no loss


def test_a_list_of_batches_resumes_where_the_checkpoint_was_taken():
    rng = np.random.default_rng(1)
    batches = []
    for _ in range(6):
        x = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
        batches.append((x, x.sum(1)))
    step = train.make_step(train.value_and_grad(_mean_loss))

    def fresh():
        return train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0))

    whole, _ = train.fit(step, fresh(), batches)
    half, _ = train.fit(step, fresh(), batches[:3])
    resumed, report = train.fit(step, half, batches, resume={"fit": {"batches": 3}})
    assert report.steps == 3 and int(resumed.step) == 6
    np.testing.assert_array_equal(np.asarray(resumed.params["w"]), np.asarray(whole.params["w"]))
    with pytest.raises(ValueError, match="continues after batch 9, but `batches` holds 6"):
        train.fit(step, fresh(), batches, resume={"fit": {"batches": 9}})


def _batches(n, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
        out.append((x, x.sum(1)))
    return out


def _fresh():
    return train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0))


def test_a_resume_over_other_data_is_refused_by_name():
    step = train.make_step(train.value_and_grad(_mean_loss))
    batches, saver = _batches(6), _Saver()
    whole, _ = train.fit(step, _fresh(), batches)
    half, _ = train.fit(step, _fresh(), batches, steps=3, callbacks=[train.Checkpointing(saver)])
    saved = saver.metadata[-1]
    assert saved["fit"]["fingerprint"]["length"] == 6 and saved["fit"]["batches"] == 3
    with pytest.raises(train.ResumeError, match=r"length 6 \(now 5\)"):
        train.fit(step, half, batches[:5], resume=saved)  # refused before a step: not donated
    other = [_batches(1, seed=2)[0], *batches[1:]]  # the same length, another first batch
    with pytest.raises(train.ResumeError, match="first batch hash"):
        train.fit(step, half, other, resume=saved)
    resumed, report = train.fit(step, half, batches, resume=saved)
    assert report.steps == 3
    np.testing.assert_array_equal(np.asarray(resumed.params["w"]), np.asarray(whole.params["w"]))


def test_a_plain_iterator_that_cannot_be_moved_is_warned_about_by_name():
    step = train.make_step(train.value_and_grad(_mean_loss))
    batches = _batches(6)
    saved = {"fit": {"batches": 3}}
    with pytest.warns(train.ResumeWarning, match=r"plain iterator that fit cannot move"):
        train.fit(step, _fresh(), (b for b in batches), resume=saved)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # positioned by the caller, or all batches alike: silent
        _, report = train.fit(
            step, _fresh(), iter(batches[3:]), resume=train.Resume(saved, positioned=True)
        )
        assert report.steps == 3
        repeated = itertools.repeat(batches[0])
        train.fit(step, _fresh(), repeated, steps=2, resume=train.Resume.after(3))


def test_callback_objects_check_their_arguments():
    with pytest.raises(TypeError, match="`metadata` must be the checkpoint's metadata"):
        train.Resume([1])  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"`writers\[0\]` must be a jaxwise.metrics.MetricWriter"):
        train.MetricLogging([print])  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`writers` must be a list"):
        train.MetricLogging(_BrokenFlush())  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="`every` must be >= 1"):
        train.MetricLogging([], every=0)
    with pytest.raises(TypeError, match=r"got Resume: Resume is no longer a callback"):
        train.fit(lambda s, b: (s, {}), _fresh(), [], callbacks=[train.Resume.after(1)])  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="`resume` must be a checkpoint's metadata"):
        train.fit(lambda s, b: (s, {}), _fresh(), [], resume=3)  # pyright: ignore[reportArgumentType]


def test_two_metric_loggings_write_at_their_own_intervals():
    step = train.make_step(train.value_and_grad(_mean_loss))
    every, sparse = _BrokenFlush(), _BrokenFlush()
    every.flush = sparse.flush = lambda: None
    logging = [train.MetricLogging([every]), train.MetricLogging([sparse], every=3)]
    train.fit(step, _fresh(), _batches(7), callbacks=logging)
    assert [s for s, _ in every.written] == list(range(1, 8))
    assert [s for s, _ in sparse.written] == [3, 6]

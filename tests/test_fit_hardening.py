"""`fit` never loses a checkpoint to a metric writer, and reads only scalar metrics (#43)."""

from __future__ import annotations

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

    def save(self, tree, metadata=None):
        del metadata
        self.steps.append(int(tree.step))


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
        train.fit(
            step, state, [_data()] * 4, checkpointer=saver, checkpoint_every=2, writers=[writer]
        )
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
    _, report = train.fit(step, state, [_data()] * 3, writers=[writer])
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
    resumed, report = train.fit(step, half, batches, resume_from={"fit": {"batches": 3}})
    assert report.steps == 3 and int(resumed.step) == 6
    np.testing.assert_array_equal(np.asarray(resumed.params["w"]), np.asarray(whole.params["w"]))
    with pytest.raises(ValueError, match="continues after batch 9, but `batches` holds 6"):
        train.fit(step, fresh(), batches, resume_from={"fit": {"batches": 9}})

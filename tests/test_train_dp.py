"""DP-SGD through the one training loop: make_dp_train_epoch is a make_train_epoch configuration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim
from jaxwise.compilation import CompileBudget
from jaxwise.privacy import PoissonSampler, add_dp_noise, make_dp_train_epoch, poisson_batch
from jaxwise.sharding import data_mesh
from jaxwise.train import DonationError, TrainState
from jaxwise.tree import host_copy


def sq_loss(w, example):
    """A per-example squared error of a linear model."""
    x, y = example
    return (jnp.dot(x, w) - y) ** 2


def sq_loss_dict(w, example):
    """The same loss with the example as a dict."""
    return (jnp.dot(example["x"], w) - example["y"]) ** 2


def make_problem(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.asarray([1.0, -2.0, 0.5])).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(y)


def sampled_rows(state_key, n, batch_size, multiple):
    """The rows each step of one Poisson epoch samples (the sampler's plan replayed outside)."""
    sampler = PoissonSampler(batch_size, multiple)
    keys, _ = sampler.plan(state_key, jnp.int32(0), n)
    rows = []
    for k in keys:
        idx, mask, _ = poisson_batch(k, n, batch_size / n, sampler.width(n))
        rows.append(set(np.asarray(idx)[np.asarray(mask)].tolist()))
    return rows


def test_dp_epoch_with_mesh_skips_exactly_the_steps_that_sample_a_nan_row():
    mesh = data_mesh(jax.devices()[:4])
    tx = optim.sgd(0.05)
    x, y = make_problem()
    x = x.at[jnp.asarray([7, 40]), 1].set(jnp.nan)  # two poisoned examples
    epoch = make_dp_train_epoch(sq_loss, tx, 16, clip_norm=5.0, noise_multiplier=0.5, mesh=mesh)
    state = TrainState.create(jnp.zeros(3), tx, jax.random.key(3))
    rows = sampled_rows(state.key, 96, 16, 4)
    with CompileBudget(1, epoch, exact=True):
        new, metrics = epoch(state, (x, y))
    expected = np.asarray([bool(r & {7, 40}) for r in rows], np.int32)
    assert expected.any() and not expected.all()  # the seed makes both kinds of steps happen
    np.testing.assert_array_equal(np.asarray(metrics["skipped"]), expected)
    assert int(new.step) == len(rows) - expected.sum()
    assert np.isfinite(np.asarray(new.params)).all()
    np.testing.assert_array_equal(np.asarray(metrics["batch_size"]), [len(r) for r in rows])
    assert epoch.sampler.width(96) % 4 == 0 and set(metrics) >= {
        "grad_norm",
        "skipped",
        "clipped_fraction",
    }
    assert epoch.jitted.__name__ == "sq_loss_train_epoch"


def test_dp_epoch_with_mesh_equals_single_device():
    tx = optim.sgd(0.05)
    x, y = make_problem()
    one = make_dp_train_epoch(sq_loss, tx, 16, clip_norm=1.0, noise_multiplier=0.7)
    four = make_dp_train_epoch(
        sq_loss_dict,
        tx,
        16,
        clip_norm=1.0,
        noise_multiplier=0.7,
        mesh=data_mesh(jax.devices()[:4]),
    )
    s1 = TrainState.create(jnp.zeros(3), tx, 5)
    s4 = TrainState.create(jnp.zeros(3), tx, 5)
    for _ in range(2):
        s1, m1 = one(s1, (x, y))
        s4, m4 = four(s4, {"x": x, "y": y})  # a dict batch on the mesh, a tuple on one device
    np.testing.assert_allclose(np.asarray(s4.params), np.asarray(s1.params), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(m4["batch_size"]), np.asarray(m1["batch_size"]))
    assert s4.params.sharding.is_fully_replicated


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_dp_step_equals_a_float64_dp_sgd_step(form):
    """One shuffled DP step replayed in NumPy float64: clip, sum, the same noise, divide, SGD."""
    tx = optim.sgd(0.1)
    x, y = make_problem(n=8)
    w0 = np.asarray([0.3, -0.2, 0.1])
    loss, data = (sq_loss, (x, y)) if form == "tuple" else (sq_loss_dict, {"x": x, "y": y})
    epoch = make_dp_train_epoch(loss, tx, 8, clip_norm=2.0, noise_multiplier=0.5, sampler="shuffle")
    state = TrainState.create(jnp.asarray(w0, jnp.float32), tx, jax.random.key(11))
    key = jax.random.wrap_key_data(jnp.array(jax.random.key_data(state.key), copy=True))
    new, metrics = epoch(state, data)
    # replay: the epoch splits (key, plan_key); the step (key, step_key); the noise uses step_key
    key, _ = jax.random.split(key)
    _, step_key = jax.random.split(key)
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    grads = 2 * (x64 @ w0 - y64)[:, None] * x64
    norms = np.linalg.norm(grads, axis=1)
    clipped = grads * np.minimum(1.0, 2.0 / norms)[:, None]
    noise = np.asarray(add_dp_noise(jnp.zeros(3), step_key, 2.0, 0.5, 1.0), np.float64)
    expected = w0 - 0.1 * (clipped.sum(0) + noise) / 8
    np.testing.assert_allclose(np.asarray(new.params), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["grad_norm_mean"][0]), norms.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["clipped_fraction"][0]), (norms > 2.0).mean())


def test_dp_epoch_audits_donation_and_keeps_its_accounting_helpers():
    tx = optim.sgd(0.05)
    x, y = make_problem()
    epoch = make_dp_train_epoch(sq_loss, tx, batch_size=24, clip_norm=1.0, noise_multiplier=1.0)
    assert epoch.steps_per_epoch(96) == 4 and epoch.sample_rate(96) == 0.25
    assert epoch.config.clip_norm == 1.0 and epoch.config.sampler == "poisson"
    state = TrainState.create(jnp.zeros(3), tx, 0)
    old = state
    state, _ = epoch(state, (x, y))
    with pytest.raises(DonationError, match="the array at `step` was already deleted"):
        epoch(old, (x, y))
    snapshot = host_copy(state)
    with pytest.raises(ValueError, match="larger than the dataset"):
        epoch(state, (x[:10], y[:10]))
    with pytest.raises(ValueError, match="leading"):
        epoch(state, {"x": x, "y": y[:50]})
    assert not state.params.is_deleted()
    np.testing.assert_array_equal(np.asarray(state.params), snapshot.params)
    with pytest.raises(ValueError, match="`sampler` must be one of"):
        make_dp_train_epoch(sq_loss, tx, 4, clip_norm=1.0, noise_multiplier=1.0, sampler="uniform")
    with pytest.raises(TypeError, match="`batch_size` must be an int"):
        make_dp_train_epoch(sq_loss, tx, 4.5, clip_norm=1.0, noise_multiplier=1.0)

"""label_errors/_ensemble.py: the fold models trained at once through train's step, vmapped."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxwise.compilation import CompileBudget
from jaxwise.label_errors._ensemble import _orders, fit_models
from jaxwise.train import TrainState

N, D, B, LR = 24, 3, 4, 0.05


def _loss(w: jax.Array, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = batch
    return jnp.mean((x @ w - y) ** 2)


def _validate(w: jax.Array, model_state: None, val: tuple[jax.Array, jax.Array]) -> jax.Array:
    del model_state
    return _loss(w, val)


@functools.partial(jax.jit, static_argnames=("epochs", "patience"))
def _fit(states, data, allowed, val, *, epochs, patience):
    return fit_models(
        _loss,
        states,
        data,
        allowed,
        _validate,
        val,
        batch_size=B,
        epochs=epochs,
        patience=patience,
    )


def _problem(nan_row: int | None = None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(N, D)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) + 0.1 * rng.normal(size=N)).astype(np.float32)
    if nan_row is not None:
        y[nan_row] = np.nan
    allowed = np.zeros((2, N), bool)
    allowed[0, :16], allowed[1, 8:] = True, True
    val = (np.stack([x[16:20], x[:4]]), np.stack([y[16:20], y[:4]]))  # each model's own rows
    w0 = np.zeros((2, D), np.float32)
    tx = optax.sgd(LR)
    states = TrainState(
        step=jnp.zeros(2, jnp.int32),
        params=jnp.asarray(w0),
        opt_state=jax.vmap(tx.init)(jnp.asarray(w0)),
        key=jax.random.split(jax.random.key(3), 2),
        tx=tx,
    )
    return x, y, allowed, val, states


def _reference(x, y, allowed, val, states, epochs, patience):
    """float64 NumPy SGD on the same orders; skip a step whose loss is not finite."""
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    w = np.zeros((2, D))
    steps = int(allowed.sum(1).min()) // B
    best, best_loss, best_epoch, waited = (
        w.copy(),
        np.full(2, np.inf),
        np.zeros(2, int),
        0 * w[:, 0],
    )
    count = np.zeros(2, np.int32)
    history = []
    for epoch in range(epochs):
        st = states.replace(step=jnp.asarray(count))
        order = np.asarray(_orders(st, jnp.asarray(allowed)))
        active = waited < (patience or epochs + 1)
        for s in range(steps):
            for m in range(2):
                if not active[m]:
                    continue
                idx = order[m, s * B : (s + 1) * B]
                err = x64[idx] @ w[m] - y64[idx]
                if np.all(np.isfinite(err)):
                    w[m] -= LR * 2 * x64[idx].T @ err / B
                    count[m] += 1
        vals = np.array([np.mean((val[0][m] @ w[m] - val[1][m]) ** 2) for m in range(2)])
        history.append(np.where(active, vals, np.nan))
        better = active & ((vals < best_loss) | (patience is None))
        best[better], best_loss[better], best_epoch[better] = w[better], vals[better], epoch + 1
        waited = np.where(better, 0, waited + 1)
    return best, best_epoch, np.asarray(history)


@pytest.mark.parametrize("patience", [None, 1])
def test_models_train_like_float64_sgd_on_their_own_rows(patience: int | None) -> None:
    x, y, allowed, val, states = _problem()
    with CompileBudget(1, exact=True):
        fit = _fit(states, (x, y), allowed, val, epochs=6, patience=patience)
    best, best_epoch, history = _reference(x, y, allowed, val, states, 6, patience)
    np.testing.assert_allclose(np.asarray(fit.params), best, rtol=2e-5, atol=2e-6)
    np.testing.assert_array_equal(np.asarray(fit.best_epoch), best_epoch)
    ran = int(fit.epochs_run)
    np.testing.assert_allclose(np.asarray(fit.val_loss)[:ran], history[:ran], rtol=2e-5)
    assert np.all(np.isnan(np.asarray(fit.val_loss)[ran:]))
    if patience is None:
        assert ran == 6 and np.all(np.asarray(fit.best_epoch) == 6)


def test_a_non_finite_step_is_skipped_for_that_model_only() -> None:
    x, y, allowed, val, states = _problem(nan_row=20)  # only model 1 trains on row 20
    fit = _fit(states, (x, y), allowed, val, epochs=3, patience=None)
    best, _, _ = _reference(x, y, allowed, val, states, 3, None)
    assert np.all(np.isfinite(np.asarray(fit.params)))
    np.testing.assert_allclose(np.asarray(fit.params), best, rtol=2e-5, atol=2e-6)
    clean = _problem()
    plain = _fit(clean[4], (clean[0], clean[1]), clean[2], clean[3], epochs=3, patience=None)
    np.testing.assert_array_equal(np.asarray(fit.params)[0], np.asarray(plain.params)[0])
    assert not np.allclose(np.asarray(fit.params)[1], np.asarray(plain.params)[1])


def test_each_model_draws_only_its_allowed_rows() -> None:
    _, _, allowed, _, states = _problem()
    order = np.asarray(_orders(states, jnp.asarray(allowed)))
    for m in range(2):
        first = order[m, : allowed[m].sum()]
        assert set(first.tolist()) == set(np.flatnonzero(allowed[m]).tolist())
        assert sorted(order[m].tolist()) == list(range(N))
    again = np.asarray(_orders(states.replace(step=states.step + 4), jnp.asarray(allowed)))
    assert not np.array_equal(order, again)  # another epoch, another shuffle

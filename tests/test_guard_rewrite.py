"""The NaN guard's two forms (``branching_guard``): nested ``lax.cond`` on XLA:CPU, ``jnp.where``
selects elsewhere — the same training (to float32 rounding: XLA fuses the two programs
differently), a skipped step bit-identical in both, no branch traced in the select form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim, privacy
from jaxwise._shared._backends import assume_backend
from jaxwise.compilation import CompileBudget
from jaxwise.train import ShuffleSampler, TrainState, make_epoch, value_and_grad


def _loss(p, batch):
    x, y = batch
    return jnp.mean((jnp.tanh(x @ p["w"]) + p["b"] - y) ** 2)


def _data(poison_row: int | None = None):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 4)).astype(np.float32)
    y = rng.normal(size=(32,)).astype(np.float32)
    if poison_row is not None:
        x[poison_row] = np.nan
    return jnp.asarray(x), jnp.asarray(y)


def _state():
    params = {"w": jnp.linspace(-0.5, 0.5, 4, dtype=jnp.float32), "b": jnp.float32(0.1)}
    return TrainState.create(params, optim.adamw(0.05), 3)


def _train(backend: str, gradient, sampler, data, epochs: int = 2):
    epoch = make_epoch(gradient, sampler)
    state = _state() if gradient.init(_state().params) == () else None
    state = state or TrainState.create(_state().params, optim.adamw(0.05), 3, gradient=gradient)
    skipped = []
    with assume_backend(backend), CompileBudget(max_compiles=1):
        for _ in range(epochs):
            state, metrics = epoch(state, data)
            skipped.append(np.asarray(metrics["skipped"]))
    text = epoch.jitted.lower(state, data).as_text()
    return state, np.concatenate(skipped), text


@pytest.mark.parametrize("poison", [None, 5], ids=["finite", "nan-row"])
def test_select_guard_trains_as_the_branching_guard(poison):
    data = _data(poison)
    runs = {b: _train(b, value_and_grad(_loss), ShuffleSampler(8), data) for b in ("cpu", "tpu")}
    (cpu_state, cpu_skip, cpu_text), (tpu_state, tpu_skip, tpu_text) = runs["cpu"], runs["tpu"]
    for a, b in zip(jax.tree.leaves(cpu_state), jax.tree.leaves(tpu_state)):
        if jnp.issubdtype(a.dtype, jax.dtypes.prng_key):
            a, b = jax.random.key_data(a), jax.random.key_data(b)
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(cpu_skip, tpu_skip)
    assert (cpu_skip.sum() > 0) == (poison is not None)
    assert "stablehlo.case" in cpu_text or "stablehlo.if" in cpu_text
    assert "stablehlo.case" not in tpu_text and "stablehlo.if" not in tpu_text


def test_private_skipped_step_counts_and_moves_the_key_in_both_forms():
    data = _data(poison_row=5)
    gradient = privacy.dp_gradient_fn(
        lambda p, ex: _loss(p, (ex[0][None], ex[1][None])), clip_norm=1.0, noise_multiplier=0.5
    )
    runs = {b: _train(b, gradient, privacy.PoissonSampler(8), data) for b in ("cpu", "tpu")}
    (cpu_state, cpu_skip, _), (tpu_state, tpu_skip, _) = runs["cpu"], runs["tpu"]
    assert int(cpu_state.step) == int(tpu_state.step) == len(cpu_skip)
    np.testing.assert_array_equal(cpu_skip, tpu_skip)
    for a, b in zip(jax.tree.leaves(cpu_state.params), jax.tree.leaves(tpu_state.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend", ["cpu", "tpu"])
def test_a_skipped_step_keeps_the_state_bit_for_bit(backend):
    x, y = _data()
    data = (jnp.full_like(x, jnp.nan), y)  # every step non-finite
    before = _state()
    expected = [np.asarray(leaf) for leaf in jax.tree.leaves((before.params, before.opt_state))]
    after, skipped, _ = _train(backend, value_and_grad(_loss), ShuffleSampler(8), data, epochs=1)
    assert skipped.tolist() == [1, 1, 1, 1] and int(after.step) == 0
    got = jax.tree.leaves((after.params, after.opt_state))
    for a, b in zip(expected, got):
        np.testing.assert_array_equal(a, np.asarray(b))

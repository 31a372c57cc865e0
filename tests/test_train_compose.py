"""Training as composition: gradient function × sampler → program.

The golden numbers in ``tests/data/compose_golden-jax<version>.npz`` were written by the old,
pre-composition API (``make_train_epoch(loss, tx, b)`` and ``make_dp_train_epoch(loss, tx,
b, ...)`` at commit c8d5d3e) with ``tests/data/make_compose_golden.py``:

    git archive c8d5d3e src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python tests/data/make_compose_golden.py

The composed programs must reproduce them bit for bit (on the JAX that wrote the file:
``tests/goldens.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import dp_accounting
import goldens
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import host_default

from jaxwise import optim
from jaxwise.compilation import CompileBudget
from jaxwise.privacy import DPGradientFn, PoissonSampler, dp_gradient_fn
from jaxwise.train import (
    GradientFn,
    Gradients,
    Requirements,
    ShuffleSampler,
    TrainState,
    make_epoch,
    make_step,
    value_and_grad,
)
from jaxwise.tree import host_copy

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import make_compose_golden as golden  # noqa: E402  # pyright: ignore[reportMissingImports]

GOLDEN, EXACT = goldens.load("compose")


def test_plain_epoch_is_bit_identical_to_the_old_make_train_epoch():
    with host_default():  # the goldens were recorded on XLA:CPU: the epochs are the host's
        x, y = golden.data()
        state = TrainState.create(golden.params(), optim.adam(0.05), jax.random.key(3))
        epoch = make_epoch(value_and_grad(golden.mse), ShuffleSampler(8))
        losses = []
        with CompileBudget(1, epoch, exact=True):
            for _ in range(3):
                state, metrics = epoch(state, (x, y))
                losses.append(metrics["loss"])
    for got, name in ((state.params["w"], "plain_w"), (state.params["b"], "plain_b")):
        _assert_golden(np.asarray(got), GOLDEN[name])
    _assert_golden(np.concatenate(losses), GOLDEN["plain_loss"])


def _assert_golden(got: np.ndarray, want: np.ndarray) -> None:
    """Bit for bit on the JAX that wrote the goldens; another XLA (the oldest lane's 0.10)
    vectorises float32 sums differently: a few ulps, far below any training change."""
    if EXACT:
        assert got.tobytes() == want.tobytes()
    else:
        np.testing.assert_allclose(got, want, rtol=0, atol=8 * np.spacing(np.abs(want).max()))


def test_composed_dp_epoch_matches_the_old_make_dp_train_epoch():
    # Bit-identical when composition landed; the padding fix that keeps NaN in masked-out rows
    # out of the gradient (a masked row is replaced by a real one before the backward pass)
    # changed XLA's summation order, so parameters and norms now agree to float32 rounding.
    # Batch sizes and the key (the sampling) stay exact.
    with host_default():  # the goldens were recorded on XLA:CPU: the epochs are the host's
        x, y = golden.data()
        gradient = dp_gradient_fn(golden.squared, clip_norm=1.0, noise_multiplier=1.1)
        state = TrainState.create(
            golden.params(), optim.sgd(0.1), jax.random.key(4), gradient=gradient
        )
        epoch = make_epoch(gradient, PoissonSampler(16))
        sizes, norms = [], []
        with CompileBudget(1, epoch, exact=True):
            for _ in range(2):
                state, metrics = epoch(state, {"x": x, "y": y})
                sizes.append(metrics["batch_size"])
                norms.append(metrics["grad_norm"])
    np.testing.assert_allclose(state.params["w"], GOLDEN["dp_w"], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(state.params["b"], GOLDEN["dp_b"], rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(np.concatenate(sizes), GOLDEN["dp_batch_size"])
    np.testing.assert_allclose(np.concatenate(norms), GOLDEN["dp_grad_norm"], rtol=1e-6)
    np.testing.assert_array_equal(jax.random.key_data(state.key), GOLDEN["dp_key"])
    assert isinstance(epoch.gradient, DPGradientFn)
    assert epoch.gradient.noise_multiplier == 1.1 and epoch.facts(50).sample_rate == 16 / 50


LAMBDA = 0.1


class L2Gradient:
    """A hand-written GradientFn: the MSE gradient plus the gradient of LAMBDA/2 |params|^2."""

    requirements = Requirements()  # needs nothing of the program

    def init(self, params):
        del params
        return ()

    def __call__(self, params, model_state, batch, state, *, key, mask, context):
        del key, mask, context
        loss, grads = jax.value_and_grad(golden.mse)(params, batch)
        grads = jax.tree.map(lambda g, p: g + LAMBDA * p, grads, params)
        return Gradients(grads, loss, model_state, state=state)


l2_gradient = L2Gradient()


def test_user_gradient_trains_through_make_epoch_with_guard_donation_and_one_compile():
    x, y = golden.data()
    state = TrainState.create(golden.params(), optim.sgd(0.1), 0)
    epoch = make_epoch(l2_gradient, ShuffleSampler(10))
    first = host_copy(state)
    old = state
    with CompileBudget(1, epoch, exact=True):
        state, metrics = epoch(state, (x, y))
        assert all(leaf.is_deleted() for leaf in jax.tree.leaves(old.params))  # donated
        # NumPy float64 referee: the same five batches (the epoch's order), SGD on loss + L2
        order = np.asarray(jnp.argsort(_hash_order(first)))[:50].reshape(5, 10)
        w, b = np.asarray(first.params["w"], np.float64), float(first.params["b"])
        x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
        for rows in order:
            r = x64[rows] @ w + b - y64[rows]
            gw, gb = 2 * x64[rows].T @ r / 10 + LAMBDA * w, 2 * r.mean() + LAMBDA * b
            w, b = w - 0.1 * gw, b - 0.1 * gb
        np.testing.assert_allclose(np.asarray(state.params["w"]), w, rtol=1e-5, atol=1e-6)
        # the NaN guard: a poisoned row skips exactly its step, the state stays finite
        poisoned = (x.at[int(order[0][0])].set(jnp.nan), y)
        before = host_copy(state)
        state, metrics = epoch(state, poisoned)
    assert int(metrics["skipped"].sum()) >= 1
    assert int(state.step) == int(before.step) + 5 - int(metrics["skipped"].sum())
    assert np.isfinite(np.asarray(state.params["w"])).all()


def _hash_order(state):
    from jaxwise.train._program._sampler import shuffle_hash

    return shuffle_hash(state.key, state.step, 50)


class CountingGradient:
    """A toy GradientFn with state: it counts the steps and sums the losses."""

    requirements = Requirements()  # a key every step (the default)

    def init(self, params):
        del params
        return {"steps": jnp.zeros((), jnp.int32), "total": jnp.zeros((), jnp.float32)}

    def __call__(self, params, model_state, batch, state, *, key, mask, context):
        del mask, context
        assert key is not None  # a hand-written gradient gets a fresh key every step
        loss, grads = jax.value_and_grad(golden.mse)(params, batch)
        new = {"steps": state["steps"] + 1, "total": state["total"] + loss}
        return Gradients(grads, loss, model_state, state=new)


def test_stateful_gradient_state_is_scanned_donated_and_compiled_once():
    x, y = golden.data()
    gradient = CountingGradient()
    assert isinstance(gradient, GradientFn)
    state = TrainState.create(golden.params(), optim.sgd(0.05), 1, gradient=gradient)
    epoch = make_epoch(gradient, ShuffleSampler(10))
    losses = []
    with CompileBudget(1, epoch, exact=True):
        for _ in range(3):
            old = state
            state, metrics = epoch(state, (x, y))
            assert old.gradient_state["steps"].is_deleted()  # donated with the state
            losses.append(np.asarray(metrics["loss"], np.float64))
    assert int(state.gradient_state["steps"]) == 15
    np.testing.assert_allclose(
        float(state.gradient_state["total"]), np.concatenate(losses).sum(), rtol=1e-5
    )


def test_stateful_gradient_refuses_a_state_of_another_structure():
    gradient = CountingGradient()
    x, y = golden.data()
    wrong = TrainState.create(golden.params(), optim.sgd(0.05), 1).replace(
        gradient_state={"steps": jnp.zeros((), jnp.int32)}
    )
    with pytest.raises(ValueError, match=r"`state.gradient_state` does not have the structure"):
        make_epoch(gradient, ShuffleSampler(10))(wrong, (x, y))
    with pytest.raises(ValueError, match=r"`state.gradient_state` does not have the structure"):
        make_step(gradient)(wrong, (x[:10], y[:10]))
    # no lazy fallback: a state with arrays is made once, by TrainState.create(gradient=)
    bare = TrainState.create(golden.params(), optim.sgd(0.05), 1)
    with pytest.raises(ValueError, match=r"gradient_state` is None.*gradient=\.\.\."):
        make_step(gradient)(bare, (x[:10], y[:10]))
    made = TrainState.create(golden.params(), optim.sgd(0.05), 1, gradient=gradient)
    new, _ = make_step(gradient)(made, (x[:10], y[:10]))
    assert int(new.gradient_state["steps"]) == 1


class UnitNoise:
    """A test NoiseMechanism: the noise is z, doubled from the second step on (a counter)."""

    min_separation = 1  # accounted as DP-SGD: any sampler

    def dp_event(self, release, *, sample_rate, steps):
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(sample_rate, release(1)), steps
        )

    def init(self, params):
        del params
        return jnp.zeros((), jnp.int32)

    def correlate(self, state, z):
        factor = jnp.where(state > 0, 2.0, 1.0)
        return jax.tree.map(lambda leaf: leaf * factor.astype(leaf.dtype), z), state + 1


def test_noise_mechanism_gets_the_dp_sgd_draw_and_carries_its_state():
    x, y = golden.data()
    data = {"x": x, "y": y}
    plain = dp_gradient_fn(golden.squared, clip_norm=1.0, noise_multiplier=1.1)
    mech = dp_gradient_fn(golden.squared, clip_norm=1.0, noise_multiplier=1.1, noise=UnitNoise())
    params = golden.params()
    a = TrainState.create(params, optim.sgd(0.1), 7, gradient=plain)
    b = TrainState.create(params, optim.sgd(0.1), 7, gradient=mech)
    a, _ = make_step(plain)(a, jax.tree.map(lambda v: v[:8], data))
    b, _ = make_step(mech)(b, jax.tree.map(lambda v: v[:8], data))
    # first step: UnitNoise returns z itself, the DP-SGD noise bit for bit
    assert np.asarray(a.params["w"]).tobytes() == np.asarray(b.params["w"]).tobytes()
    assert int(b.gradient_state["noise"]) == 1 and b.gradient_state["clip"] == ()
    with pytest.raises(TypeError, match="`noise` must be None or a jaxwise.privacy.NoiseMechanism"):
        dp_gradient_fn(golden.squared, clip_norm=1.0, noise_multiplier=1.0, noise=object())  # pyright: ignore[reportArgumentType]  # bad input on purpose


class HalvingClip:
    """A test ClipPolicy: the clip norm starts at 4 and halves every step."""

    def init(self):
        return jnp.asarray(4.0, jnp.float32)

    def norm(self, state):
        return state

    def update(self, state, norms, mask, normal, expected_batch_size):
        del norms, mask, normal, expected_batch_size
        return state / 2

    def dp_event(self, participations):
        del participations
        return None  # a schedule: it releases nothing about the data


def test_clip_policy_sets_the_clip_norm_of_each_step():
    x, y = golden.data()
    batch = {"x": x[:8], "y": y[:8]}
    gradient = dp_gradient_fn(golden.squared, clip_norm=HalvingClip(), noise_multiplier=0.0)
    state = TrainState.create(golden.params(), optim.sgd(0.1), 0, gradient=gradient)
    step = make_step(gradient)
    with CompileBudget(1, step, exact=True):
        for expected in (4.0, 2.0, 1.0):
            before = host_copy(state)
            state, metrics = step(state, batch)
            assert float(metrics["clip_norm"]) == expected
            # float64 referee: clip each example's gradient at `expected`, mean, SGD
            w, b = np.asarray(before.params["w"], np.float64), float(before.params["b"])
            x64, y64 = np.asarray(x[:8], np.float64), np.asarray(y[:8], np.float64)
            r = x64 @ w + b - y64
            g = np.concatenate([2 * r[:, None] * x64, 2 * r[:, None]], axis=1)
            norms = np.linalg.norm(g, axis=1)
            clipped = g * np.minimum(1.0, expected / norms)[:, None]
            mean = clipped.mean(0)
            np.testing.assert_allclose(
                np.asarray(state.params["w"]), w - 0.1 * mean[:3], rtol=1e-5, atol=1e-6
            )
    assert float(state.gradient_state["clip"]) == 0.5

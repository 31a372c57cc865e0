"""Mixed precision: bf16/f16 compute with float32 master weights, dynamic loss scaling."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import Tolerance

import jaxwise.train
from jaxwise import data, numerics, optim
from jaxwise.compilation import CompileBudget
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.train import (
    DynamicLossScale,
    LossScaleState,
    TrainState,
    make_train_step,
)
from jaxwise.train._program._precision import cast_floating
from jaxwise.tree import host_copy


def spiral_loss(params, batch):
    logits = mlp_apply(params, batch[0]).astype(jnp.float32)  # the loss itself in float32
    return numerics.cross_entropy(logits, batch[1])


def linear_loss(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] - y) ** 2)


@pytest.mark.slow
def test_bf16_spiral_reaches_90_percent_with_float32_master_weights():
    x, y = data.make_spiral(300, 3, 0.15, seed=0)
    xtr, xte, ytr, yte = data.train_test_split(x, y, test_fraction=0.2, seed=0)
    tx = optim.adam(1e-2)
    state = TrainState.create(init_mlp(jax.random.key(0), (2, 64, 64, 3)), tx, 1)
    epoch = jaxwise.train.make_epoch(
        jaxwise.train.mixed_precision(
            jaxwise.train.value_and_grad(spiral_loss), compute_dtype=jnp.bfloat16
        ),
        jaxwise.train.ShuffleSampler(64),
    )
    train = (jnp.asarray(xtr), jnp.asarray(ytr))
    with CompileBudget(1, epoch, exact=True):
        for _ in range(60):
            state, metrics = epoch(state, train)
    assert {str(leaf.dtype) for leaf in jax.tree.leaves(state.params)} == {"float32"}
    assert {str(leaf.dtype) for leaf in jax.tree.leaves(state.opt_state)} <= {"float32", "int32"}
    assert int(metrics["skipped"].sum()) == 0  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    accuracy = float(
        jnp.mean(mlp_apply(state.params, jnp.asarray(xte)).argmax(-1) == jnp.asarray(yte))
    )
    assert accuracy >= 0.9, accuracy


def test_bf16_step_computes_in_bf16_and_updates_float32_weights(key):
    seen = []

    def loss(params, batch):
        seen.append((params["w"].dtype, batch[0].dtype, batch[1].dtype))
        return linear_loss(params, batch)

    params = {"w": jax.random.normal(key, (4,))}
    x = jax.random.normal(jax.random.key(1), (16, 4))
    y = x @ jnp.asarray([1.0, 2.0, 3.0, 4.0])
    tx = optim.sgd(0.1)
    new, metrics = jaxwise.train.make_step(
        jaxwise.train.mixed_precision(
            jaxwise.train.value_and_grad(loss), compute_dtype=jnp.bfloat16
        )
    )(TrainState.create(params, tx, 0), (x, y))
    assert seen[-1] == (jnp.bfloat16, jnp.bfloat16, jnp.bfloat16)
    assert new.params["w"].dtype == jnp.float32 and metrics["loss"].dtype == jnp.float32
    # float64 referee: the same SGD step with the bf16-rounded inputs
    w64, x64, y64 = (np.asarray(a.astype(jnp.bfloat16), np.float64) for a in (params["w"], x, y))
    grad = 2 * x64.T @ (x64 @ w64 - y64) / 16
    np.testing.assert_allclose(
        np.asarray(new.params["w"]),
        np.asarray(params["w"], np.float64) - 0.1 * grad,
        rtol=3e-2,
        atol=3e-2,
    )
    # integer leaves are never cast
    assert cast_floating({"n": jnp.arange(3)}, jnp.bfloat16)["n"].dtype == jnp.int32


def test_f16_dynamic_loss_scale_skips_overflow_steps_and_recovers(key):
    params = {"w": jnp.zeros(4)}
    x = jax.random.normal(jax.random.key(1), (32, 4))
    y = x @ jnp.asarray([1.0, 2.0, 3.0, 4.0])
    tx = optim.sgd(0.05)
    scaler = DynamicLossScale(initial_scale=2.0**24, growth_interval=4)
    gradient = jaxwise.train.mixed_precision(
        jaxwise.train.value_and_grad(linear_loss), compute_dtype=jnp.float16, loss_scale=scaler
    )
    step = jaxwise.train.make_step(gradient)
    with pytest.raises(ValueError, match="gradient=\\.\\.\\."):  # no lazy fallback
        step(TrainState.create(params, tx, 0), (x, y))
    state = TrainState.create(params, tx, 0, gradient=gradient)  # the scale: the gradient's state
    assert isinstance(state.gradient_state["loss_scale"], LossScaleState)
    skipped, scales, losses = [], [], []
    with CompileBudget(1, step, exact=True):
        for _ in range(30):
            before = host_copy(state.params)
            state, metrics = step(state, (x, y))
            skipped.append(int(metrics["skipped"]))
            scales.append(float(metrics["loss_scale"]))
            losses.append(float(metrics["loss"]))
            if skipped[-1]:
                np.testing.assert_array_equal(np.asarray(state.params["w"]), before["w"])
    assert isinstance(state.gradient_state["loss_scale"], LossScaleState)
    # overflow at 2**24: the scale halves on each skipped step until the scaled gradients fit f16
    first_good = skipped.index(0)
    assert first_good >= 3 and skipped[:first_good] == [1] * first_good
    assert scales[: first_good + 1] == [2.0**24 / 2**i for i in range(first_good + 1)]
    # and then it trains: the loss falls tenfold, with at most periodic probing overflows
    assert losses[-1] < 0.1 * losses[first_good]
    assert int(state.step) == 30 - sum(skipped)
    assert state.params["w"].dtype == jnp.float32
    # growth: after 4 good steps in a row the scale doubles
    run = scales[first_good : first_good + 6]
    assert run[4] == 2 * run[0]


def test_fixed_loss_scale_gives_the_unscaled_gradient(key):
    params = {"w": jax.random.normal(key, (4,))}
    x = jax.random.normal(jax.random.key(1), (8, 4))
    batch = (x, x @ jnp.ones(4))
    tx = optim.sgd(0.1)
    plain, m1 = make_train_step(linear_loss)(TrainState.create(params, tx, 0), batch)
    scaled, m2 = jaxwise.train.make_step(
        jaxwise.train.mixed_precision(
            jaxwise.train.value_and_grad(linear_loss), compute_dtype=jnp.float32, loss_scale=1024.0
        )
    )(TrainState.create(params, tx, 0), batch)
    np.testing.assert_allclose(
        np.asarray(scaled.params["w"]), np.asarray(plain.params["w"]), rtol=1e-6
    )
    np.testing.assert_allclose(float(m2["grad_norm"]), float(m1["grad_norm"]), rtol=1e-6)


def test_dynamic_loss_scale_arithmetic():
    cfg = DynamicLossScale(initial_scale=8.0, growth_interval=2, factor=2.0, min_scale=2.0)
    s = cfg.init()
    s = cfg.adjust(s, jnp.asarray(True))
    assert (float(s.scale), int(s.good_steps)) == (8.0, 1)
    s = cfg.adjust(s, jnp.asarray(True))
    assert (float(s.scale), int(s.good_steps)) == (16.0, 0)
    for expected in (8.0, 4.0, 2.0, 2.0):
        s = cfg.adjust(s, jnp.asarray(False))
        assert (float(s.scale), int(s.good_steps)) == (expected, 0)
    with pytest.raises(ValueError, match="`growth_interval` must be >= 1"):
        DynamicLossScale(growth_interval=0)
    with pytest.raises(ValueError, match="`factor` must be > 1.0"):
        DynamicLossScale(factor=1.0)


# ---------------------------------------------------------------------------
# Model state keeps its stored dtype: BatchNorm statistics accumulate in float32
# ---------------------------------------------------------------------------


def _bn_cnn(conv_dtype=None):
    from flax import nnx

    class CNN(nnx.Module):
        def __init__(self, rngs):
            self.conv = nnx.Conv(1, 4, (3, 3), dtype=conv_dtype, rngs=rngs)
            self.bn = nnx.BatchNorm(4, rngs=rngs)
            self.out = nnx.Linear(6 * 6 * 4, 3, rngs=rngs)

        def __call__(self, x):
            x = nnx.relu(self.bn(self.conv(x)))
            return self.out(x.reshape(x.shape[0], -1))

    return CNN(nnx.Rngs(0))


@pytest.mark.parametrize("program", ["step", "epoch"])
def test_bf16_keeps_batchnorm_statistics_float32_like_plain_flax(program):
    pytest.importorskip("flax")
    import optax

    from jaxwise.models import from_nnx

    model = from_nnx(_bn_cnn())

    def loss(params, model_state, batch):
        logits, new_state = model.apply(params, model_state, batch[0])
        return numerics.cross_entropy(logits.astype(jnp.float32), batch[1]), new_state

    x = jax.random.normal(jax.random.key(1), (16, 6, 6, 1))
    y = jnp.arange(16) % 3
    tx = optax.sgd(0.0)  # parameters stay put: the batch statistics are the same every step
    state = TrainState.create(model.params, tx, 0, model_state=model.model_state)
    steps = 25
    # Flax promotes bfloat16 with float32 by JAX's standard rules (strict in this suite)
    with warnings.catch_warnings(), jax.numpy_dtype_promotion("standard"):
        warnings.simplefilter("error")  # e.g. "scatter inputs have incompatible types"
        if program == "step":
            step = jaxwise.train.make_step(
                jaxwise.train.mixed_precision(
                    jaxwise.train.value_and_grad(loss, model_state=True), compute_dtype=jnp.bfloat16
                )
            )
            with CompileBudget(1, step, exact=True):
                for _ in range(steps):
                    state, _ = step(state, (x, y))
        else:
            epoch = jaxwise.train.make_epoch(
                jaxwise.train.mixed_precision(
                    jaxwise.train.value_and_grad(loss, model_state=True), compute_dtype=jnp.bfloat16
                ),
                jaxwise.train.ShuffleSampler(16),
            )
            with CompileBudget(1, epoch, exact=True):
                for _ in range(steps):
                    state, _ = epoch(state, (x, y))
    stats = state.model_state["bn"]
    assert stats["mean"][...].dtype == stats["var"][...].dtype == jnp.float32

    # plain Flax mixed precision: the convolution computes in bfloat16, statistics in float32
    peer = _bn_cnn(conv_dtype=jnp.bfloat16)
    with jax.numpy_dtype_promotion("standard"):
        for _ in range(steps):
            peer(x)
    conv = np.asarray(peer.conv(x).astype(jnp.float32), np.float64).reshape(-1, 4)
    decay = 0.99**steps  # nnx.BatchNorm's momentum 0.99; initial mean 0, variance 1
    mean_tol, var_tol = _bf16_statistics_tolerances(conv, decay)
    np.testing.assert_allclose(stats["mean"][...], peer.bn.mean[...], **mean_tol)
    np.testing.assert_allclose(stats["var"][...], peer.bn.var[...], **var_tol)

    # float64 referee: the momentum recursion from the bfloat16 convolution's batch moments
    # (off the CPU, the statistics' own bfloat16 rounding, as above, comes on top)
    on_cpu = jax.default_backend() == "cpu"
    np.testing.assert_allclose(
        stats["mean"][...],
        (1 - decay) * conv.mean(0),
        rtol=1e-5,
        atol=0.0 if on_cpu else mean_tol["atol"],
    )
    np.testing.assert_allclose(
        stats["var"][...],
        decay + (1 - decay) * conv.var(0),
        rtol=1e-5,
        atol=1e-7 if on_cpu else var_tol["atol"],
    )


def _bf16_statistics_tolerances(conv, decay):
    """``(mean, var)`` tolerances of BatchNorm statistics kept from a bfloat16 convolution.

    XLA:CPU rounds the bfloat16 convolution output the same way in the jitted step and in
    eager Flax: the statistics agree to float32 rounding. XLA:TPU may keep that output in
    float32 inside a fusion (excess precision): each output then differs by up to its bfloat16
    rounding, 2⁻⁸ of it, and a running statistic by ``(1 - decay)`` times the batch moment's
    change (the mean: 2⁻⁸·mean|c|; the variance: twice 2⁻⁸·mean(|c|·|c − μ|)), doubled.
    """
    if jax.default_backend() == "cpu":
        return Tolerance(rtol=1e-6, atol=1e-7), Tolerance(rtol=1e-6, atol=1e-7)
    rounding = 2.0**-8  # bfloat16: 8 significant bits
    mean_change = rounding * np.abs(conv).mean()
    var_change = 2 * rounding * (np.abs(conv) * np.abs(conv - conv.mean(0))).mean()
    return (
        Tolerance(rtol=0.0, atol=2 * (1 - decay) * mean_change),
        Tolerance(rtol=0.0, atol=2 * (1 - decay) * var_change),
    )

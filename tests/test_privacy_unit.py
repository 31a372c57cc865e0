"""`privacy.unit_clip`: the DP gradient divided by the step's clip norm (De et al. 2022)."""

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim, privacy, train
from jaxwise.compilation import CompileBudget
from jaxwise.privacy import BLT, AdaptiveClip, BandMF, unit_clip
from jaxwise.privacy._mechanisms._noise import standard_normal

TRUE_W = np.asarray([1.0, -2.0, 0.5])


def loss(p, ex):
    return (ex["x"] @ p["w"] - ex["y"]) ** 2


def data(n: int = 64) -> dict[str, jax.Array]:
    x = jax.random.normal(jax.random.key(0), (n, 3))
    return {"x": x, "y": x @ jnp.asarray(TRUE_W, jnp.float32)}


def referee(w, batch, mask, clip, sigma, z) -> np.ndarray:
    """float64: (Σ clip_C(g_i) over real rows + σ·C·z) / B / C, g_i = 2(x_i·w − y_i)x_i."""
    x, y = np.asarray(batch["x"], np.float64), np.asarray(batch["y"], np.float64)
    g = 2.0 * (x @ np.asarray(w, np.float64) - y)[:, None] * x
    norms = np.linalg.norm(g, axis=1)
    clipped = g * np.minimum(1.0, clip / norms)[:, None] * np.asarray(mask, np.float64)[:, None]
    noisy = clipped.sum(0) + sigma * clip * np.asarray(z, np.float64)
    return noisy / x.shape[0] / clip


@pytest.mark.parametrize("method", ["ghost", "vmap"])
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_released_gradient_is_the_plain_one_over_c_float64_referee(method, adaptive):
    params, batch = {"w": jnp.asarray([0.3, 0.1, -0.2])}, data(12)
    mask = jnp.arange(12) < 10  # two padding rows
    key, sigma = jax.random.key(5), 0.8
    clip: Any = AdaptiveClip(0.5) if adaptive else 0.7
    plain = privacy.dp_gradient_fn(loss, clip_norm=clip, noise_multiplier=sigma, method=method)
    gradient = unit_clip(plain)
    state = gradient.init(params)
    c = 0.7
    if adaptive:  # a later step of the policy: the clip norm in the state is 2.5
        state = {**state, "clip": {"clip_norm": jnp.float32(2.5)}}
        c = 2.5
    # the rows as the divisor (the referee's), the gradient's own accounting in the context
    context = train.StepContext(12.0, privacy=plain.requirements.privacy)
    ours = gradient(params, None, batch, state, key=key, mask=mask, context=context)
    theirs = plain(params, None, batch, state, key=key, mask=mask, context=context)
    np.testing.assert_allclose(
        np.asarray(ours.grads["w"]), np.asarray(theirs.grads["w"]) / c, rtol=1e-6
    )
    # the gradient's noise leads the step's one draw (a policy's normal comes after it)
    z = standard_normal(key, params)["w"]
    expected = referee(params["w"], batch, mask, c, sigma, z)
    np.testing.assert_allclose(np.asarray(ours.grads["w"]), expected, rtol=2e-5, atol=1e-6)
    # the state and metrics are the wrapped gradient's
    assert ours.metrics is not None and theirs.metrics is not None
    assert ours.metrics.keys() == theirs.metrics.keys()
    for a, b in zip(jax.tree.leaves(ours.state), jax.tree.leaves(theirs.state)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _epoch(gradient: Any, sampler: Any, lr: float, momentum: float | None = None):
    tx = optim.sgd(lr, momentum=momentum)
    state = train.TrainState.create({"w": jnp.zeros(3)}, tx, 0, gradient=gradient)
    return train.make_epoch(gradient, sampler), state


@pytest.mark.parametrize(
    "noise, groups",
    [(None, 1), (BandMF(4, steps=16), 4), (BLT(2, steps=16), 1)],
    ids=["dpsgd-poisson", "bandmf-cyclic", "blt-poisson"],
)
@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_trains_through_make_epoch_once_compiled(noise, groups, adaptive):
    clip: Any = AdaptiveClip(1.0) if adaptive else 1.0
    plain = privacy.dp_gradient_fn(loss, clip_norm=clip, noise_multiplier=1.0, noise=noise)
    sampler = (
        privacy.PoissonSampler(8) if groups == 1 else privacy.CyclicPoissonSampler(8, groups=4)
    )
    epoch, state = _epoch(unit_clip(plain), sampler, 0.1)
    with CompileBudget(1, epoch, exact=True):
        state, metrics = epoch(state, data())
        state, metrics = epoch(state, data())
    assert np.isfinite(np.asarray(state.params["w"])).all()
    assert int(np.asarray(metrics["skipped"]).sum()) == 0
    if adaptive:
        assert "clip_norm" in metrics


def test_fixed_clip_is_the_plain_run_at_learning_rate_over_c():
    # SGD: lr · (g / C) == (lr / C) · g, so a whole epoch (same keys, same noise) agrees
    c = 4.0
    plain = privacy.dp_gradient_fn(loss, clip_norm=c, noise_multiplier=0.5)
    sampler = privacy.PoissonSampler(8)
    unit_epoch, s1 = _epoch(unit_clip(plain), sampler, 0.2)
    plain_epoch, s2 = _epoch(plain, sampler, 0.2 / c)
    s1, _ = unit_epoch(s1, data())
    s2, _ = plain_epoch(s2, data())
    np.testing.assert_allclose(np.asarray(s1.params["w"]), np.asarray(s2.params["w"]), rtol=1e-5)
    assert not np.allclose(np.asarray(s1.params["w"]), 0.0)


def _final_clip(gradient: Any) -> tuple[float, np.ndarray]:
    epoch, state = _epoch(gradient, privacy.PoissonSampler(16), 0.5, momentum=0.9)
    batch = data(256)
    for _ in range(10):
        state, _ = epoch(state, batch)
    return float(state.gradient_state["clip"]["clip_norm"]), np.asarray(state.params["w"])


def test_adaptive_clip_at_quantile_09_stays_bounded():
    # target quantile 0.9: the released gradient grows with C, bigger steps give bigger norms
    # and C follows them up; divided by C the step is bounded and C tracks the shrinking norms
    policy = AdaptiveClip(1.0, target_quantile=0.9, learning_rate=0.2, count_noise=16 / 20)
    plain = privacy.dp_gradient_fn(loss, clip_norm=policy, noise_multiplier=1.0)
    unit_c, unit_w = _final_clip(unit_clip(plain))
    plain_c, plain_w = _final_clip(plain)
    assert unit_c < 10.0  # the 0.9 quantile of the gradient norms at w = 0 is about 10
    assert np.linalg.norm(unit_w - TRUE_W) < 1.0
    # the feedback (seeds 0-7: plain C 11-92 vs 1.9-3.2 divided, error 2.7-36 vs 0.1-0.44)
    assert plain_c > 3 * unit_c and np.linalg.norm(plain_w - TRUE_W) > 2.0


@pytest.mark.parametrize(
    "noise, clip",
    [(None, 1.0), (None, AdaptiveClip(1.0, count_noise=2.0)), (BandMF(4, steps=32), 1.0)],
    ids=["fixed", "adaptive", "bandmf"],
)
def test_epsilon_is_unchanged(noise, clip):
    plain = privacy.dp_gradient_fn(loss, clip_norm=clip, noise_multiplier=1.3, noise=noise)
    sampler = privacy.CyclicPoissonSampler(8, groups=1 if noise is None else 4)
    kw: dict[str, Any] = {"steps": 32, "delta": 1e-5}
    ours = privacy.epoch_epsilon(train.make_epoch(unit_clip(plain), sampler), 256, **kw)
    theirs = privacy.epoch_epsilon(train.make_epoch(plain, sampler), 256, **kw)
    assert ours == theirs and np.isfinite(ours)
    wrapped = unit_clip(plain)
    assert (wrapped.clip_norm, wrapped.noise_multiplier, wrapped.noise) == (clip, 1.3, noise)


@pytest.mark.parametrize("bad", [1.0, loss, "dpsgd"], ids=["float", "function", "str"])
def test_bad_gradient_is_named(bad):
    with pytest.raises(TypeError, match="`gradient` must be a privacy.DPGradientFn"):
        unit_clip(bad)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_unit_clip_twice_and_bad_pairing_are_refused():
    gradient = unit_clip(privacy.dp_gradient_fn(loss, clip_norm=1.0, noise_multiplier=1.0))
    with pytest.raises(TypeError, match="UnitClipped"):
        unit_clip(gradient)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    banded = privacy.dp_gradient_fn(
        loss, clip_norm=1.0, noise_multiplier=1.0, noise=BandMF(4, steps=16)
    )
    with pytest.raises(privacy.PairingError, match="CyclicPoissonSampler"):
        train.make_epoch(unit_clip(banded), privacy.PoissonSampler(8))

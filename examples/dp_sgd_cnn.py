"""DP-SGD on a small CNN with ghost clipping, and the privacy spent (ε at δ = 1e-5).

A two-layer convolutional classifier of 12×12 images (a vertical or a horizontal bar in
noise). Ghost clipping computes every example's gradient norm from one forward and one
backward pass — the analysis of the traced program finds the conv and dense kernels — and
its clipped sum equals the per-example (`vmap`) computation. Training runs Poisson-sampled
DP-SGD epochs (one compiled program each), and dp-accounting's RDP accountant reports ε.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import optim
from jaxwise.per_example import clip_and_sum, ghost_coverage
from jaxwise.privacy import epsilon, make_dp_train_epoch
from jaxwise.train import TrainState


def make_images(n, seed):
    rng = np.random.default_rng(seed)
    x = 0.3 * rng.normal(size=(n, 12, 12, 1)).astype(np.float32)
    y = rng.integers(0, 2, size=n).astype(np.int32)
    pos = rng.integers(2, 10, size=n)
    for i in range(n):
        if y[i]:
            x[i, :, pos[i], 0] += 1.0  # vertical bar
        else:
            x[i, pos[i], :, 0] += 1.0  # horizontal bar
    return x, y


def init(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "conv1": {"w": 0.3 * jax.random.normal(k1, (3, 3, 1, 8)), "b": jnp.zeros(8)},
        "conv2": {"w": 0.1 * jax.random.normal(k2, (3, 3, 8, 8)), "b": jnp.zeros(8)},
        "dense": {"w": 0.1 * jax.random.normal(k3, (8, 2)), "b": jnp.zeros(2)},
    }


def conv(x, layer, stride):
    out = jax.lax.conv_general_dilated(
        x[None], layer["w"], (stride, stride), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")
    )
    return jax.nn.relu(out[0] + layer["b"])


def logits_single(params, image):
    h = conv(image, params["conv1"], 1)
    h = conv(h, params["conv2"], 2)
    return jnp.mean(h, axis=(0, 1)) @ params["dense"]["w"] + params["dense"]["b"]


def loss(params, example):
    """Cross-entropy of ONE example ``{"image", "label"}`` (what per-example clipping needs)."""
    return -jax.nn.log_softmax(logits_single(params, example["image"]))[example["label"]]


x, y = make_images(1024, seed=0)
params = init(jax.random.key(0))
for row in ghost_coverage(loss, params, {"image": x[0], "label": y[0]}):
    print(f"  {row}")

first = {"image": x[:64], "label": y[:64]}
ghost_sum, ghost_norms = clip_and_sum(loss, params, first, clip_norm=1.0, method="ghost")
vmap_sum, vmap_norms = clip_and_sum(loss, params, first, clip_norm=1.0, method="vmap")
np.testing.assert_allclose(ghost_norms, vmap_norms, rtol=1e-4)
for a, b in zip(jax.tree.leaves(ghost_sum), jax.tree.leaves(vmap_sum)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
print("ghost clipping equals per-example clipping (64 examples, rtol 1e-4)")

tx = optim.adam(3e-3)
epoch = make_dp_train_epoch(loss, 64, clip_norm=1.0, noise_multiplier=1.0, method="ghost")
state = TrainState.create(params, tx, jax.random.key(1))
epochs = 6
for _ in range(epochs):
    state, metrics = epoch(state, {"image": jnp.asarray(x), "label": jnp.asarray(y)})

test_x, test_y = make_images(512, seed=1)
logits = jax.vmap(logits_single, in_axes=(None, 0))(state.params, jnp.asarray(test_x))
accuracy = float(jnp.mean(jnp.argmax(logits, -1) == test_y))
steps = epochs * epoch.steps_per_epoch(len(x))
eps = epsilon(noise_multiplier=1.0, sample_rate=epoch.sample_rate(len(x)), steps=steps, delta=1e-5)
print(f"{steps} DP-SGD steps: test accuracy {accuracy:.2f}, ε = {eps:.2f} at δ = 1e-5")
assert accuracy > 0.8

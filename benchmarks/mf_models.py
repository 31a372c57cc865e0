"""Datasets and small models shared by the correlated-noise DP benchmarks (bench_mf_*.py).

Three tasks, each split into train / validation / test: the spiral (5 arms, angle noise
0.2) for an MLP, and a generated 8×8 "digits" set (10 classes: a smooth random template per
class, randomly shifted by up to 1 pixel each way, plus pixel noise) for an MLP and a small
CNN. scikit-learn's digits are used instead where scikit-learn is installed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.data import make_spiral


class Task(NamedTuple):
    """A model on a dataset: per-example loss, init, logits and the three splits."""

    name: str
    init: Callable[[jax.Array], Any]
    logits: Callable[[Any, jax.Array], jax.Array]  # (params, x batch) -> (B, classes)
    train: dict[str, jax.Array]
    val: dict[str, jax.Array]
    test: dict[str, jax.Array]

    def loss(self, params: Any, example: dict[str, jax.Array]) -> jax.Array:
        logits = self.logits(params, example["x"][None])[0]
        return -jax.nn.log_softmax(logits)[example["y"]]

    def accuracy(self, params: Any, split: dict[str, jax.Array]) -> float:
        pred = jnp.argmax(self.logits(params, split["x"]), axis=1)
        return float(jnp.mean(pred == split["y"]))


def _split(x: np.ndarray, y: np.ndarray, n_train: int, n_val: int) -> tuple[dict, dict, dict]:
    perm = np.random.default_rng(0).permutation(len(x))
    x, y = x[perm], y[perm]
    cut = (slice(0, n_train), slice(n_train, n_train + n_val), slice(n_train + n_val, None))
    return tuple({"x": jnp.asarray(x[s]), "y": jnp.asarray(y[s])} for s in cut)  # pyright: ignore[reportReturnType]


def generated_digits(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` 8×8 images in [0, 1] of 10 classes, float32 ``(n, 8, 8)`` and int32 labels."""
    rng = np.random.default_rng(seed)
    grid = rng.random((10, 12, 12)) < 0.35
    kernel = np.outer([1, 2, 1], [1, 2, 1]) / 16.0
    templates = np.zeros((10, 12, 12))
    for c in range(10):  # a 3×3 blur of a random binary pattern
        padded = np.pad(grid[c].astype(float), 1)
        templates[c] = sum(
            kernel[i, j] * padded[i : i + 12, j : j + 12] for i in range(3) for j in range(3)
        )
    y = rng.integers(0, 10, n)
    dx, dy = rng.integers(1, 4, n), rng.integers(1, 4, n)
    x = np.stack([templates[c, a : a + 8, b : b + 8] for c, a, b in zip(y, dx, dy)])
    x = np.clip(x + rng.normal(0.0, 0.25, x.shape), 0.0, 1.0)
    return x.astype(np.float32), y.astype(np.int32)


def digits(n: int) -> tuple[np.ndarray, np.ndarray, str]:
    try:
        from sklearn.datasets import load_digits  # pyright: ignore[reportMissingImports]
    except ImportError:
        x, y = generated_digits(n)
        return x, y, "generated digits"
    features, target = load_digits(return_X_y=True)
    x = (np.asarray(features, np.float32) / 16.0).reshape(-1, 8, 8)
    return x, np.asarray(target, np.int32), "scikit-learn digits"


def mlp_init(sizes: list[int]) -> Callable[[jax.Array], Any]:
    def init(key: jax.Array) -> Any:
        params = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            key, k = jax.random.split(key)
            params.append((jax.random.normal(k, (a, b)) * math.sqrt(2.0 / a), jnp.zeros(b)))
        return params

    return init


def mlp_logits(params: Any, x: jax.Array) -> jax.Array:
    x = x.reshape(x.shape[0], -1)
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def cnn_init(key: jax.Array) -> Any:
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "c1": jax.random.normal(k1, (3, 3, 1, 8)) * math.sqrt(2.0 / 9),
        "b1": jnp.zeros(8),
        "c2": jax.random.normal(k2, (3, 3, 8, 16)) * math.sqrt(2.0 / 72),
        "b2": jnp.zeros(16),
        "w": jax.random.normal(k3, (4 * 4 * 16, 10)) * math.sqrt(1.0 / 256),
        "b": jnp.zeros(10),
    }


def cnn_logits(params: Any, x: jax.Array) -> jax.Array:
    dims = ("NHWC", "HWIO", "NHWC")
    h = x.reshape(x.shape[0], 8, 8, 1)
    h = jax.lax.conv_general_dilated(h, params["c1"], (1, 1), "SAME", dimension_numbers=dims)
    h = jax.nn.relu(h + params["b1"])
    h = jax.lax.conv_general_dilated(h, params["c2"], (2, 2), "SAME", dimension_numbers=dims)
    h = jax.nn.relu(h + params["b2"])
    return h.reshape(h.shape[0], -1) @ params["w"] + params["b"]


def tasks(n_train: int, n_val: int, n_test: int) -> list[Task]:
    """The spiral MLP, the digits MLP and the digits CNN on ``n_train/n_val/n_test`` splits."""
    total = n_train + n_val + n_test
    xs, ys = make_spiral(-(-total // 5), 5, noise=0.2, seed=0)
    spiral = _split(xs, ys, n_train, n_val)
    xd, yd, label = digits(total)
    n_tr = min(n_train, len(xd) - n_val - n_test)
    dig = _split(xd, yd, n_tr, n_val)
    return [
        Task("spiral MLP 2-64-64-5", mlp_init([2, 64, 64, 5]), mlp_logits, *spiral),
        Task(f"{label} MLP 64-128-10", mlp_init([64, 128, 10]), mlp_logits, *dig),
        Task(f"{label} CNN (2 conv, 3.8k params)", cnn_init, cnn_logits, *dig),
    ]

"""Writes tests/data/compose_golden-jax<version>.npz: training numbers of the pre-composition API.

Run once against jaxwise at commit c8d5d3e (before `make_epoch`/`dp_gradient_fn` existed):

    git archive c8d5d3e src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python tests/data/make_compose_golden.py

`tests/test_train_compose.py` checks that the composed programs reproduce them bit for bit.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import optim
from jaxwise.privacy import make_dp_train_epoch
from jaxwise.train import TrainState, make_train_epoch


def data():
    x = jax.random.normal(jax.random.key(1), (50, 3))
    y = x @ jnp.asarray([1.0, -2.0, 0.5]) + 0.1 * jax.random.normal(jax.random.key(2), (50,))
    return x, y


def mse(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def squared(params, example):
    return (jnp.dot(example["x"], params["w"]) + params["b"] - example["y"]) ** 2


def params():
    return {"w": jnp.asarray([0.1, 0.2, -0.3]), "b": jnp.zeros(())}


def main():
    x, y = data()
    out = {}
    tx = optim.adam(0.05)
    state = TrainState.create(params(), tx, jax.random.key(3))
    epoch = make_train_epoch(mse, tx, 8)  # pyright: ignore[reportCallIssue, reportArgumentType]
    losses = []
    for _ in range(3):
        state, metrics = epoch(state, (x, y))
        losses.append(metrics["loss"])
    out["plain_w"], out["plain_b"] = state.params["w"], state.params["b"]
    out["plain_loss"] = jnp.concatenate(losses)
    tx = optim.sgd(0.1)
    state = TrainState.create(params(), tx, jax.random.key(4))
    epoch = make_dp_train_epoch(squared, tx, 16, clip_norm=1.0, noise_multiplier=1.1)  # pyright: ignore[reportCallIssue, reportArgumentType]
    sizes, norms = [], []
    for _ in range(2):
        state, metrics = epoch(state, {"x": x, "y": y})
        sizes.append(metrics["batch_size"])
        norms.append(metrics["grad_norm"])
    out["dp_w"], out["dp_b"] = state.params["w"], state.params["b"]
    out["dp_batch_size"], out["dp_grad_norm"] = jnp.concatenate(sizes), jnp.concatenate(norms)
    out["dp_key"] = jax.random.key_data(state.key)
    target = f"tests/data/compose_golden-jax{jax.__version__}.npz"  # see tests/goldens.py
    np.savez(target, **{k: np.asarray(v) for k, v in out.items()})  # pyright: ignore[reportArgumentType]


if __name__ == "__main__":
    main()

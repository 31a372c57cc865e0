"""The peer of ``jaxwise spiral``: a plain Flax + Optax script training the same MLP.

Run as a whole process by ``bench_spiral.py`` (``python _flax_spiral.py [EPOCHS]``): imports,
data, initialisation, the training loop (a Python loop over one jitted step, NumPy shuffling)
and the test accuracy, printed as one JSON line. Same data (``jaxwise.data``, NumPy only),
model, optimizer and schedule as the CLI's main job.
"""

import json
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwise import data

EPOCHS = int(sys.argv[1]) if len(sys.argv) > 1 else 150
BATCH = 128


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Dense(64, kernel_init=nn.initializers.he_normal())(x))
        x = nn.relu(nn.Dense(64, kernel_init=nn.initializers.he_normal())(x))
        return nn.Dense(3, kernel_init=nn.initializers.he_normal())(x)


def main() -> None:
    x, y = data.make_spiral(600, 3, 0.15, seed=0)
    xtr, xte, ytr, yte = data.train_test_split(x, y, test_fraction=0.2, seed=0)
    steps = EPOCHS * (len(xtr) // BATCH)
    schedule = optax.warmup_cosine_decay_schedule(0.0, 1e-2, 100, steps, 1e-4)
    tx = optax.chain(
        optax.clip_by_global_norm(1.0),
        optax.scale_by_adam(),
        optax.add_decayed_weights(
            1e-4,
            mask=lambda p: jax.tree_util.tree_map_with_path(
                lambda path, _: path[-1].key == "kernel", p
            ),
        ),
        optax.scale_by_learning_rate(schedule),
    )
    model = MLP()
    params = model.init(jax.random.key(0), jnp.ones((1, 2)))
    opt_state = tx.init(params)

    @jax.jit
    def train_step(params, opt_state, x, y):
        def loss_fn(p):
            logits = model.apply(p, x)
            return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    rng = np.random.default_rng(0)
    for _ in range(EPOCHS):
        order = rng.permutation(len(xtr))
        for i in range(len(xtr) // BATCH):
            idx = order[i * BATCH : (i + 1) * BATCH]
            params, opt_state, _ = train_step(params, opt_state, xtr[idx], ytr[idx])
    logits = np.asarray(model.apply(params, jnp.asarray(xte)))
    print(json.dumps({"test_accuracy": float((logits.argmax(1) == yte).mean())}))


if __name__ == "__main__":
    main()

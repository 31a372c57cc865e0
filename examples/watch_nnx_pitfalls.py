"""Three silent pitfalls in one Flax NNX training script, for `jaxwise watch` to find.

Run as it is, it trains and prints a loss per epoch. Run under the watch, unchanged:

    jaxwise watch --nans=report examples/watch_nnx_pitfalls.py

and the report names each pitfall with its line (see docs/watch.md):

1. the learning rate is a Python float passed as a static argument and decayed every epoch:
   one new program per epoch, a steady-state recompile;
2. one batch holds a negative feature and the model takes its `log`: a NaN;
3. a NumPy view of a weight, kept for a plot, pins the buffer the step donates: the donation
   is silently skipped (a second copy of the weight stays in memory).
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx


class Regressor(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(2, 16, rngs=rngs)
        self.out = nnx.Linear(16, 1, rngs=rngs)

    def __call__(self, x):
        features = jnp.log(x)  # pitfall 2: NaN for a negative feature
        return self.out(jax.nn.relu(self.hidden(features)))


model = Regressor(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.sgd(1.0), wrt=nnx.Param)


@nnx.jit(static_argnames="lr", donate_argnums=(0, 1))
def train_step(model, optimizer, x, y, lr):
    def loss_fn(model):
        return jnp.mean((model(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, jax.tree.map(lambda g: lr * g, grads))
    return loss


rng = np.random.default_rng(0)
x = rng.uniform(0.5, 2.0, (6, 32, 2)).astype(np.float32)
y = np.sum(np.log(x), axis=-1, keepdims=True)
bad = x[4].copy()
bad[0, 0] = -1.0  # one bad value, in the last epoch's batch 4

lr = 0.1
weights_seen = []
for epoch in range(4):
    for batch in range(6):
        features = bad if (epoch, batch) == (3, 4) else x[batch]
        loss = train_step(model, optimizer, features, y[batch], lr=lr)  # pitfall 1: static lr
    weights_seen.append(np.asarray(model.out.kernel[...]))  # pitfall 3: a view, kept
    lr = lr * 0.5
    print(f"epoch {epoch}: loss {float(loss):.4f}")

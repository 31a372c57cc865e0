"""A Flax NNX model with BatchNorm trained by jaxwise's scanned epoch.

The model enters through `jaxwise.models.from_nnx`: its parameters are trained, its
BatchNorm running statistics travel as `model_state`. Each epoch — shuffle, 15 mini-batches,
updates — is one compiled `lax.scan` program with the state donated. A batch of NaNs is
skipped: parameters, optimizer state and running statistics stay bit-identical.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxwise import optim
from jaxwise.compilation import CompileCounter
from jaxwise.data import make_spiral
from jaxwise.models import from_nnx
from jaxwise.train import TrainState, make_train_epoch, make_train_step
from jaxwise.tree import host_copy, tree_allclose


class Net(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.hidden = nnx.Linear(2, 64, rngs=rngs)
        self.norm = nnx.BatchNorm(64, rngs=rngs)
        self.out = nnx.Linear(64, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.norm(self.hidden(x))))


net = Net(nnx.Rngs(0))
model = from_nnx(net)


def loss_fn(params, model_state, batch):
    logits, model_state = model.apply(params, model_state, batch[0])
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, batch[1]).mean()
    return loss, model_state


x, y = make_spiral(320, n_classes=3, seed=0)
data = (jnp.asarray(x), jnp.asarray(y))
tx = optim.adam(1e-2)
state = TrainState.create(model.params, tx, jax.random.key(0), model_state=model.model_state)
epoch = make_train_epoch(loss_fn, 64, model_state=True)
stats_before = host_copy(state.model_state)

with CompileCounter(epoch) as compiles:
    for _ in range(40):
        state, metrics = epoch(state, data)
print(f"40 epochs: loss {float(metrics['loss'][-1]):.3f}, compiles of the epoch: {compiles.count}")
print("running statistics changed:", not tree_allclose(stats_before, host_copy(state.model_state)))

evaluate = from_nnx(nnx.view(net, use_running_average=True)).apply
logits, _ = evaluate(state.params, state.model_state, data[0])
print(f"eval-mode accuracy {float(jnp.mean(jnp.argmax(logits, -1) == data[1])):.2f}")

step = make_train_step(loss_fn, model_state=True)
before = host_copy((state.params, state.opt_state, state.model_state))
bad = (jnp.full((64, 2), jnp.nan), data[1][:64])
state, metrics = step(state, bad)
after = host_copy((state.params, state.opt_state, state.model_state))
same = all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after)))
print(f"NaN batch skipped: {int(metrics['skipped'])}, every state leaf bit-identical: {same}")
assert compiles.count == 1 and same

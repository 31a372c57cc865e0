"""Fine-tune a pre-trained MLP on a new task with its first layer frozen, state donated.

`optim.freeze` (last in the chain) keeps the frozen encoder bit-identical — weight decay
included — while the head adapts. The training step donates its state (the old buffers are
reused for the new one) and audits the donation on every call: here a live NumPy view of a
parameter, which silently cancels donation on CPU, is caught and named.
"""

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import optim
from jaxwise.compilation import CompileCounter
from jaxwise.data import make_spiral
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.train import DonationError, TrainState, make_train_step
from jaxwise.tree import host_copy

x, y = make_spiral(200, n_classes=3, seed=0)
pretrained = init_mlp(jax.random.key(0), (2, 64, 64, 3))  # stands in for loaded weights


def loss_fn(params, batch):
    logits = mlp_apply(params, batch[0])
    return -jnp.mean(jax.nn.log_softmax(logits)[jnp.arange(batch[1].shape[0]), batch[1]])


tx = optim.chain(
    optim.adamw(1e-2, weight_decay=1e-3),
    optim.freeze(r"^dense_0\."),  # the encoder: every leaf under dense_0
)
state = TrainState.create(pretrained, tx, jax.random.key(1))
encoder_before = host_copy(state.params["dense_0"])  # a real copy, safe across donation
step = make_train_step(loss_fn)
batch = (jnp.asarray(x), jnp.asarray(y))

with CompileCounter(step) as compiles:
    for _ in range(300):
        state, metrics = step(state, batch)
accuracy = float(jnp.mean(jnp.argmax(mlp_apply(state.params, batch[0]), -1) == batch[1]))
frozen = all(np.array_equal(encoder_before[k], state.params["dense_0"][k]) for k in ("w", "b"))
print(f"loss {float(metrics['loss']):.3f}, accuracy {accuracy:.2f}, compiles {compiles.count}")
print(f"encoder bit-identical after 300 steps: {frozen}")
assert frozen and compiles.count == 1

view = np.asarray(state.params["dense_1"]["w"])  # a zero-copy view pins the buffer on CPU
try:
    state, metrics = step(state, batch)
except DonationError as err:
    print("caught:", str(err).split(":")[0])
    state, metrics = err.result  # nothing is lost: the step's result rides on the error
del view
state, metrics = step(state, batch)  # without the view, donation works again
print(f"step {int(state.step)} after the audit, loss {float(metrics['loss']):.3f}")

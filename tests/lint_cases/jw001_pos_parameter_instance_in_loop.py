# expect: JW001@17
import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)


def evaluate(net, variables, batches):
    total = 0.0
    for batch in batches:
        predict = jax.jit(net.apply)  # re-created (and compiled) on every iteration
        total += predict(variables, batch).sum()
    return total


model = MLP()
params = model.init(jax.random.key(0), jnp.ones((1, 2)))
print(evaluate(model, params, [jnp.ones((4, 2))] * 3))

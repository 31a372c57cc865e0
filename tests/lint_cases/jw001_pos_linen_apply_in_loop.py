# expect: JW001@17
import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)


model = MLP()
variables = model.init(jax.random.key(0), jnp.ones((1, 2)))
for step in range(3):
    batch = jnp.ones((4, 2)) * step
    logits = jax.jit(model.apply)(variables, batch)  # a new bound method: 3 compiles

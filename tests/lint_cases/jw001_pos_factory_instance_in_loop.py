# expect: JW001@20
import flax.linen as nn
import jax
import jax.numpy as jnp


class CNN(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(x)


def create_model():
    return CNN()


net = create_model()
variables = net.init(jax.random.key(0), jnp.ones((1, 2)))
for batch in [jnp.ones((4, 2))] * 3:
    logits = jax.jit(net.apply)(variables, batch)  # a new bound method every iteration

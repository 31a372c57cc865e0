# expect: JW010@8
import jax
import jax.numpy as jnp

def loss(params, x, y):
    return jnp.sum((x @ params - y) ** 2)

per_example_grads = jax.vmap(jax.grad(loss))

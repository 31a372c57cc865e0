# expect: JW010@6
import jax
import jax.numpy as jnp

def per_example(params, xs, ys):
    return jax.vmap(jax.grad(lambda p, x, y: jnp.sum((x * p - y) ** 2)))(params, xs, ys)

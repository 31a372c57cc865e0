# expect: -
import jax.numpy as jnp

def f(x, mask):
    return jnp.where(mask, jnp.exp(x), 0.0)

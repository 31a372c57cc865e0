# expect: -
import jax.numpy as jnp

def mean(a, n):
    ok = n > 0
    return jnp.where(ok, a / jnp.maximum(n, 1), 0.0)

# expect: JW007@6
import jax.numpy as jnp

def mean(a, n):
    ok = n > 0
    return jnp.where(ok, a / n, 0.0)

# expect: JW007@5
import jax.numpy as jnp

def inverse(x):
    return jnp.where(x != 0, 1.0 / x, 0.0)

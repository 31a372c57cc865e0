# expect: JW007@6
import jax.numpy as jnp

def norm(v):
    s = jnp.sum(v * v)
    return jnp.where(s > 0, jnp.sqrt(s), 0.0)

# expect: -
import jax.numpy as jnp

def safe_log(x):
    return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), 0.0)

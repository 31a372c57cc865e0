# expect: -
import jax
import jax.numpy as jnp

def dropout(key, x, rate):
    keep = jax.random.bernoulli(key, rate, x.shape)  # a random mask, not a test of `rate`
    return jnp.where(keep, x / rate, 0.0)

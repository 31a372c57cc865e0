# expect: JW006@10
import jax
import jax.numpy as jnp

FREQUENCIES = jnp.arange(4096.0)[:, None] / 4096  # still 4,096 elements


@jax.jit
def encode(t):
    return jnp.sin(FREQUENCIES * t)

# expect: JW006@8
import jax
import jax.numpy as jnp

TABLE = jnp.arange(100000)

def lookup(i):
    return TABLE[i]

lookup_fast = jax.jit(lookup)

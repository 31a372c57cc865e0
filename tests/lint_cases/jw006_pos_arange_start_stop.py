# expect: JW006@9
import jax
import jax.numpy as jnp

POSITIONS = jnp.arange(0, 4096)

@jax.jit
def embed(x):
    return x + jnp.sin(POSITIONS[: x.shape[0]])

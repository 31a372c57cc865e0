# expect: -
import jax
import jax.numpy as jnp

GRID = jnp.arange(0.0, 5.0, 0.01)  # 500 points: below the threshold


@jax.jit
def energy(w):
    return jnp.sum(jnp.sin(GRID * w))

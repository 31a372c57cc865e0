# expect: JW006@10
import jax
import jax.numpy as jnp

GRID = jnp.arange(0.0, 50.0, 0.01)  # 5,000 points


@jax.jit
def energy(w):
    return jnp.sum(jnp.sin(GRID * w))

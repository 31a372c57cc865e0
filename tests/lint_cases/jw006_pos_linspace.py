# expect: JW006@9
import jax
import jax.numpy as jnp

GRID = jnp.linspace(0.0, 1.0, 10_000)

@jax.jit
def integrate(f_values):
    return jnp.trapezoid(f_values, GRID)

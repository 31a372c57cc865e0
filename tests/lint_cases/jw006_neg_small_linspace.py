# expect: -
import jax
import jax.numpy as jnp

TICKS = jnp.linspace(0.0, 1.0)  # NumPy's default: 50 points
STEPS = jnp.arange(10, 4000, 400)  # 10 entries

@jax.jit
def interpolate(x):
    return jnp.interp(x, TICKS, TICKS ** 2) + STEPS.sum()

# expect: -
import jax

@jax.jit
def f(x):
    return jax.lax.fori_loop(0, 1000, lambda i, v: v * 0.99, x)

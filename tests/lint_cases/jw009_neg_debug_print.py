# expect: -
import jax

@jax.jit
def step(x):
    jax.debug.print("x = {x}", x=x)
    return x * 2

# expect: -
import jax

@jax.jit
def f(x):
    for i in range(8):
        x = x * 0.99
    return x

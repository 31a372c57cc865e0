# expect: JW005@6
import jax

@jax.jit
def f(x):
    for i in range(1000):
        x = x * 0.99
    return x

# expect: JW005@5
import jax

def g(x):
    for i in range(0, 500, 2):
        x = x + i
    return x

g_fast = jax.jit(g)

# expect: JW005@8
import jax

STEPS = 500

@jax.jit
def relax(x):
    for _ in range(STEPS):
        x = 0.5 * (x + 1.0 / x)
    return x

# expect: JW009@6
import jax

@jax.jit
def step(x):
    print("x =", x)
    return x * 2

# expect: -
import jax

@jax.jit
def step(x):
    def show(value):
        print("x =", value)  # runs on the host with the concrete value
    jax.debug.callback(show, x)
    return x * 2

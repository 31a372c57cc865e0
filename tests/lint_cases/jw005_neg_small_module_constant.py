# expect: -
import jax

LAYERS = 4

@jax.jit
def deep(x):
    for _ in range(LAYERS):
        x = jax.numpy.tanh(x)
    return x

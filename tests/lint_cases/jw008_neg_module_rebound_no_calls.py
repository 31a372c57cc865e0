# expect: -
import jax

MOMENTUM = 0.9
MOMENTUM = 0.99  # a library module: rebound at import, before any caller runs

@jax.jit
def update(v, g):
    return MOMENTUM * v + g

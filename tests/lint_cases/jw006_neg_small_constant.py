# expect: -
import jax
import numpy as np

SCALE = np.ones(3)

@jax.jit
def f(x):
    return SCALE * x

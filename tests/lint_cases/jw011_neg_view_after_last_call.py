# expect: -
import jax
import numpy as np

@jax.jit
def step(w):
    return w * 0.5

step_donating = jax.jit(lambda w: w * 0.5, donate_argnums=0)

def run(w):
    w = step_donating(w)
    return np.asarray(w)

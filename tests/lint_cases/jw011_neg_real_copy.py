# expect: -
import jax
import numpy as np

update_fast = jax.jit(lambda p, g: p - g, donate_argnums=0)

def train(params, grads):
    snapshot = np.array(params, copy=True)
    params = update_fast(params, grads)
    return params, snapshot

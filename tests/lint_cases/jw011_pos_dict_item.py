# expect: JW011@11
import jax
import numpy as np

update = jax.jit(lambda params, grads: params - 0.1 * grads, donate_argnums=0)

def train(params, batches):
    history = {}
    for i, grads in enumerate(batches):
        params = update(params, grads)
        history[i] = np.asarray(params)
    return params, history

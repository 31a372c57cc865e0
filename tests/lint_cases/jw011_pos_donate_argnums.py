# expect: JW011@11
import jax
import numpy as np

def update(params, grads):
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)

update_fast = jax.jit(update, donate_argnums=0)

def train(params, grads):
    snapshot = np.asarray(params["w"])
    params = update_fast(params, grads)
    return params, snapshot

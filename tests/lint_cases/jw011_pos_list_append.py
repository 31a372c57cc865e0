# expect: JW011@10
import jax
import numpy as np

update = jax.jit(lambda params, grads: params - 0.1 * grads, donate_argnums=0)

def train(params, batches):
    snapshots = []
    for grads in batches:
        snapshots.append(np.asarray(params))
        params = update(params, grads)
    return params, snapshots

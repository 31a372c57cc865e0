# expect: JW011@7
import numpy as np
from jaxwise.train import make_train_step


def fit(state, batches, loss_fn, optimizer):
    step = make_train_step(loss_fn)
    best = np.asarray(state.params["w"])
    for batch in batches:
        state, metrics = step(state, batch)
    return state, best

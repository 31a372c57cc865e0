# expect: JW011@11
from functools import partial
import jax
import numpy as np

@partial(jax.jit, donate_argnames="x")
def double(x):
    return 2 * x

def run(x):
    host = np.array(x, copy=False)
    y = double(x)
    return y, host

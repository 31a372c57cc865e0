# expect: JW009@8
from functools import partial
import jax

@partial(jax.jit, static_argnames="verbose")
def step(x, verbose=False):
    if verbose:
        print("loss", x.sum())
    return x

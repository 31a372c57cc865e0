# expect: JW006@9
import jax
import numpy as np

W = np.random.normal(size=(300, 300))

@jax.jit
def f(x):
    return W @ x

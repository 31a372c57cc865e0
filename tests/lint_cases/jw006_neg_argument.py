# expect: -
import jax
import numpy as np

W = np.random.normal(size=(300, 300))

@jax.jit
def f(w, x):
    return w @ x

y = f(W, np.ones(300))

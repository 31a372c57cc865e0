# expect: JW006@9
import jax
import numpy as np

BASIS = np.eye(64, 64)

@jax.jit
def project(x):
    return BASIS @ x

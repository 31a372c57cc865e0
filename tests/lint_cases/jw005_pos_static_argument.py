# expect: JW005@7
from functools import partial
import jax

@partial(jax.jit, static_argnames="n")
def power_iteration(m, v, n):
    for _ in range(n):
        v = m @ v
        v = v / jax.numpy.linalg.norm(v)
    return v

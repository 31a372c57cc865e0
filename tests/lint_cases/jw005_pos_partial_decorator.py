# expect: JW005@7
from functools import partial
import jax

@partial(jax.jit, static_argnums=1)
def h(x, n):
    for _ in range(128):
        x = x + n
    return x

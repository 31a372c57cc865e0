# expect: JW001@10
from functools import partial
import jax

def train(xs):
    def step(x, n):
        return x * n
    out = []
    for x in xs:
        out.append(partial(jax.jit, static_argnums=1)(step)(x, 3))
    return out

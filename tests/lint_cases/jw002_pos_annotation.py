# expect: JW002@10
from functools import partial
import jax

class Config:
    def __init__(self, depth):
        self.depth = depth

@partial(jax.jit, static_argnames=("cfg",))
def apply(x, cfg: Config):
    return x * cfg.depth

# expect: -
from functools import partial
from typing import NamedTuple
import jax

class Config(NamedTuple):
    depth: int

@partial(jax.jit, static_argnames=("cfg",))
def apply(x, cfg: Config):
    return x * cfg.depth

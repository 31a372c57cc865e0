# expect: -
import dataclasses
from functools import partial
import jax

@dataclasses.dataclass(frozen=True)
class Config:
    depth: int

@partial(jax.jit, static_argnames=("cfg",))
def apply(x, cfg: Config):
    return x * cfg.depth

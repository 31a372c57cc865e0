# expect: -
import jax

class Config:
    pass

@jax.jit
def apply(x, cfg: Config):
    return x

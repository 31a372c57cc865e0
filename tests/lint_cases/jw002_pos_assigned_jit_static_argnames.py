# expect: JW002@14
import jax

class Cfg:
    def __init__(self, depth):
        self.depth = depth

def g(x, cfg):
    return x * cfg.depth

f = jax.jit(g, static_argnames="cfg")

def run(x):
    return f(x, cfg=Cfg(2))

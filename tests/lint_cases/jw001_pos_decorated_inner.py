# expect: JW001@8
import jax

def outer(x, scale):
    @jax.jit
    def inner(v):
        return v * scale
    return inner(x)

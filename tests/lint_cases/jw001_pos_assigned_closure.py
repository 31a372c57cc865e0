# expect: JW001@8
import jax

def run(x, w):
    def loss(v):
        return (v * w).sum()
    fast = jax.jit(loss)
    return fast(x)

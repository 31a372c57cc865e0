# expect: JW001
import jax

def predict(x):
    return jax.jit(lambda v: v * 2)(x)

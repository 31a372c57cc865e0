# expect: JW001@5
import jax

def predict(x):
    return jax.jit(lambda v: v * 2)(x)

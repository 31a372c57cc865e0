# expect: -
import os
import jax

if os.environ.get("FAST"):
    scale = 2.0
else:
    scale = 1.0

@jax.jit
def f(x):
    return x * scale

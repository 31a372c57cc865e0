# expect: -
import jax

def square(x):
    return x * x

def use(x):
    return jax.jit(square)(x)  # same function object every time: JAX's cache hits

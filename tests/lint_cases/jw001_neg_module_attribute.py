# expect: -
import jax
import jax.numpy as jnp

def predict(x):
    return jax.jit(jnp.tanh)(x)  # a module's function: the same object every time, cache hits

# expect: -
import jax

class Model:
    pass

def g(x, model):
    return x

g_fast = jax.jit(g, static_argnums=1)

def run(x):
    return g(x, Model())  # the plain Python function: nothing is compiled or hashed

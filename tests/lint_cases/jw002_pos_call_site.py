# expect: JW002@13
import jax

class Settings:
    pass

def f(x, settings):
    return x

f_jit = jax.jit(f, static_argnums=1)

def run(x):
    return f_jit(x, Settings())

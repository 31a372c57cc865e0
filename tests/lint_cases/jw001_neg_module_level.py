# expect: -
import jax

def double(x):
    return 2 * x

double_jit = jax.jit(double)

def use(x):
    return double_jit(x)

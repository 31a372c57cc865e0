# expect: JW009@6
import functools
import jax

def step(w, x, scale):
    print("step", w, x)
    return w - scale * x

fast_step = jax.jit(functools.partial(step, scale=0.1))

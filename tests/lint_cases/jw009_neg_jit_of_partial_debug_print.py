# expect: -
import functools
import jax

def step(w, x, scale):
    jax.debug.print("step {w}", w=w)
    return w - scale * x

fast_step = jax.jit(functools.partial(step, scale=0.1))
print(fast_step(1.0, 2.0))

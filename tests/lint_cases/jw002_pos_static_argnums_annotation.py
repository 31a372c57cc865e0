# expect: JW002@7
import jax

class Opts:
    scale = 2.0

def g(x, opts: Opts):
    return x * opts.scale

g_jit = jax.jit(g, static_argnums=(1,))

# expect: -
import jax

key = jax.random.key(0)
b = jax.random.normal(key, (16,))

@jax.jit
def layer(x):
    return x + b

# expect: -
import jax

def init_layers(key, sizes):
    keys = jax.random.split(key, len(sizes))
    return [jax.random.normal(k, (n, n)) for k, n in zip(keys, sizes)]

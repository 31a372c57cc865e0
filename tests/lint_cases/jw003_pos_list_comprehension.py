# expect: JW003@5
import jax

def init_layers(key, sizes):
    return [jax.random.normal(key, (n, n)) for n in sizes]  # the same key for every layer

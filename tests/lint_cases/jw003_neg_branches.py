# expect: -
import jax

def sample(key, kind):
    if kind == "normal":
        x = jax.random.normal(key, ())
    else:
        x = jax.random.uniform(key, ())
    return x

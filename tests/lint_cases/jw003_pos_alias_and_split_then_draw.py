# expect: JW003@6
from jax import random as jr

def sample(key):
    k1, k2 = jr.split(key)
    extra = jr.uniform(key, ())
    return k1, k2, extra

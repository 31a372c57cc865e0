# expect: -
import jax


def sample(key, n):
    return jax.random.normal(key, (n,))


def train(key, split):
    first, second = split(key)
    a = sample(first, 3)
    b = sample(second, 3)  # two keys: independent draws
    return a + b

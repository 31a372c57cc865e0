# expect: JW003@11
import jax


def sample(key, n):
    return jax.random.normal(key, (n,))


def train(key):
    a = sample(key, 3)
    b = sample(key, 3)  # the same key again: b == a
    return a + b

# expect: -
import jax


class Dropout:
    def __init__(self, key):
        self.key = key

    def __call__(self, x):
        self.key, sub = jax.random.split(self.key)
        mask = jax.random.bernoulli(sub, 0.9, x.shape)
        self.key, sub = jax.random.split(self.key)
        return x * mask + 0.01 * jax.random.normal(sub, x.shape)

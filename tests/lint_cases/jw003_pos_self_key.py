# expect: JW003@11
import jax


class Dropout:
    def __init__(self, key):
        self.key = key

    def __call__(self, x):
        mask = jax.random.bernoulli(self.key, 0.9, x.shape)
        noise = jax.random.normal(self.key, x.shape)
        return x * mask + 0.01 * noise

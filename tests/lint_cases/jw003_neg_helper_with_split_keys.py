# expect: -
import jax


def sample_weights(key, n):
    return jax.random.normal(key, (n, n))


key = jax.random.key(0)
k1, k2 = jax.random.split(key)
w1 = sample_weights(k1, 4)
w2 = sample_weights(k2, 4)

# expect: JW003@11
import jax


def sample_weights(key, n):
    return jax.random.normal(key, (n, n))


key = jax.random.key(0)
w1 = sample_weights(key, 4)
w2 = sample_weights(key, 4)  # identical to w1

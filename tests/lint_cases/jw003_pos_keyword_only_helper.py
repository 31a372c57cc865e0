# expect: JW003@13
import jax.numpy as jnp
import jax.random as jrandom


def get_data(dataset_size, *, key):
    offset = jrandom.uniform(key, (dataset_size, 1))
    return jnp.sin(offset), jnp.cos(offset)


key = jrandom.key(0)
xs, ys = get_data(64, key=key)
test_xs, test_ys = get_data(64, key=key)  # the same "test" data as the training data

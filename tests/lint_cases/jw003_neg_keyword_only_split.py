# expect: -
import equinox as eqx
import jax.random as jrandom


def get_data(dataset_size, *, key):
    return jrandom.uniform(key, (dataset_size, 1))


data_key, model_key = jrandom.split(jrandom.key(0))
train_key, test_key = jrandom.split(data_key)
xs = get_data(64, key=train_key)
test_xs = get_data(64, key=test_key)
first_key, second_key = jrandom.split(model_key)
first = eqx.nn.Linear(4, 4, key=first_key)
second = eqx.nn.Linear(4, 4, key=second_key)

# expect: -
import jax


class Logger:
    def record(self, key, value):
        print(jax.random.key_data(key), value)  # reads the key, draws nothing


def describe(key, n):
    return jax.random.fold_in(key, n)  # derives a new key: the key itself is not consumed


key = jax.random.key(0)
log = Logger()
log.record(key, 1)
log.record(key, 2)
a = describe(key, 1)
b = describe(key, 2)

# expect: -
import jax

key = jax.random.key(0)
key, sub = jax.random.split(key)
w = jax.random.normal(sub, (3, 3))
key, sub = jax.random.split(key)
b = jax.random.normal(sub, (3,))

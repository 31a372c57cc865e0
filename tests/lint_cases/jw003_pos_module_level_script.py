# expect: JW003@6
import jax

key = jax.random.key(0)
w = jax.random.normal(key, (3, 3))
b = jax.random.normal(key, (3,))
print(w @ b)

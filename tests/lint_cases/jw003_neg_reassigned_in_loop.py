# expect: -
import jax

def walk(key, n):
    xs = []
    for _ in range(n):
        key, sub = jax.random.split(key)
        xs.append(jax.random.normal(sub, ()))
    return xs

# expect: -
import jax

def per_step(key, n):
    out = []
    for i in range(n):
        step_key = jax.random.fold_in(key, i)
        out.append(jax.random.normal(step_key, ()))
    return out

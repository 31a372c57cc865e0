# expect: JW003@8
import jax
import jax.numpy as jnp

def noisy(xs, key):
    out = []
    for x in xs:
        out.append(x + jax.random.normal(key, x.shape))
    return jnp.stack(out)

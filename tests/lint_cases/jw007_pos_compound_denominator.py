# expect: JW007@7
import jax.numpy as jnp

def cosine(a, b):
    na = jnp.linalg.norm(a)
    nb = jnp.linalg.norm(b)
    return jnp.where((na > 0) & (nb > 0), jnp.dot(a, b) / (na * nb), 0.0)

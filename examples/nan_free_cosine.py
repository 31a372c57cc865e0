"""A cosine-similarity loss whose gradient turns NaN at a zero vector — found and fixed.

`jnp.where(norm > 0, dot / norm, 0)` looks safe, but its *gradient* is NaN at a zero vector:
the discarded branch's 0/0 still reaches the gradient. `locate_nan` names the equation, its
line and the pass (the backward `mul` by 1/n up to JAX 0.12.0, the forward `div` whose NaN
quotient the backward pass reuses from 0.12.1); `jaxwise.numerics.cosine_similarity` is the
double-where fix.
"""

import jax
import jax.numpy as jnp

from jaxwise.debug import locate_nan
from jaxwise.numerics import cosine_similarity


def naive_cosine(a, b):
    norm = jnp.linalg.norm(a) * jnp.linalg.norm(b)
    return jnp.where(norm > 0, jnp.dot(a, b) / norm, 0.0)


def loss(a, b):
    return 1.0 - naive_cosine(a, b)


a = jnp.zeros(3)  # e.g. an all-zero embedding
b = jnp.array([1.0, 2.0, 3.0])
print("forward value:", float(loss(a, b)))
print("naive gradient:", jax.grad(loss)(a, b))

report = locate_nan(jax.grad(loss), a, b)
print("locate_nan:", report)
assert report is not None and report.frame is not None and report.frame.function == "naive_cosine"

safe_grad = jax.grad(lambda a, b: 1.0 - cosine_similarity(a, b))(a, b)
print("jaxwise gradient:", safe_grad)
assert bool(jnp.all(jnp.isfinite(safe_grad)))

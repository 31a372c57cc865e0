# expect: JW001@7
import jax
import jax.numpy as jnp


def evaluate(w, x):
    return jax.jit(lambda v: (v * w).sum())(x)  # re-created on every call of evaluate


for epoch in range(10):
    print(evaluate(jnp.ones(3), jnp.ones(3)))

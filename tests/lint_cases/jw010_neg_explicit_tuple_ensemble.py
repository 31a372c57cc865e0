# expect: -
import jax
import jax.numpy as jnp

def loss(params, x):
    return jnp.sum(params * x)

# One parameter vector per ensemble member, the same batch for all: mapping params is intended.
ensemble_grads = jax.vmap(jax.grad(loss), in_axes=(0, None))

# expect: -
import jax.numpy as jnp

def capped_step(cap, lb, bc1):
    # bc1 appears in the condition only inside a product: the condition does not test it for zero
    return jnp.where(cap < bc1 * lb, lb, cap / (2.0 * bc1))

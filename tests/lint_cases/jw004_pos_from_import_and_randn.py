# expect: JW004 JW004
import jax.numpy as jnp
from jax import tree_leaves

def f(tree):
    return tree_leaves(tree), jnp.randn(3)

# expect: JW004@3 JW004@6
import jax.numpy as jnp
from jax import tree_leaves

def f(tree):
    return tree_leaves(tree), jnp.randn(3)

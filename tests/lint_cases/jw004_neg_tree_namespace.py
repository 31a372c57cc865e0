# expect: -
import jax

def scale(tree):
    return jax.tree.map(lambda x: 2 * x, jax.tree.leaves(tree))

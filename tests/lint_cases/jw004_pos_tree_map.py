# expect: JW004@5
import jax

def scale(tree):
    return jax.tree_map(lambda x: 2 * x, tree)

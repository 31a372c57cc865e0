# expect: JW004@5
import jax

def rebuild(treedef, leaves):
    return jax.tree_util.build_tree(treedef, leaves)

# expect: -
import optax

def f(tree):
    return optax.tree_utils.tree_map_params(lambda x: x, tree)

def tree_map(fn, tree):
    return fn(tree)

# expect: -
import haiku as hk
import jax


def train(net: hk.Transformed, params, batches):
    for batch in batches:
        out = jax.jit(net.apply)(params, None, batch)  # a NamedTuple field: cache hits
    return out

# expect: JW001@7
import jax


def evaluate(net, variables, batches):
    for batch in batches:
        out = jax.jit(net.apply)(variables, batch)  # `net` untyped: a Flax module recompiles
    return out

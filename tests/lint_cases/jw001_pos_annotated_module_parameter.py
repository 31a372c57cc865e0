# expect: JW001@8
import flax.linen as nn
import jax


def train(net: nn.Module, variables, batches):
    for batch in batches:
        loss = jax.jit(net.apply)(variables, batch).mean()
    return loss

# expect: -
import jax


def evaluate(net, variables, batches):
    predict = jax.jit(net.apply)  # created once per call, reused by every iteration
    for batch in batches:
        out = predict(variables, batch)
    return out

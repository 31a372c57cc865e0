# expect: -
import haiku as hk
import jax
import jax.numpy as jnp


def forward(x):
    return hk.Linear(1)(x)


def evaluate(net, params, batches):
    for batch in batches:
        out = jax.jit(net.apply)(params, None, batch)  # a NamedTuple field: cache hits
    return out


def make_net():
    return hk.transform(forward)


net = make_net()
params = net.init(jax.random.key(0), jnp.ones((1, 2)))
print(evaluate(net, params, [jnp.ones((4, 2))] * 3))
print(evaluate(hk.transform(forward), params, [jnp.ones((4, 2))]))

# expect: -
import haiku as hk
import jax
import jax.numpy as jnp


def forward(x):
    return hk.Linear(1)(x)


net = hk.transform(forward)
params = net.init(jax.random.key(0), jnp.ones((1, 2)))
for step in range(3):
    out = jax.jit(net.apply)(params, None, jnp.ones((4, 2)))  # a NamedTuple field: cache hits

# expect: JW006@9
import jax

key = jax.random.key(0)
W = jax.random.normal(key, (256, 256))

@jax.jit
def layer(x):
    return jax.numpy.tanh(W @ x)

# expect: JW010@7
import jax

def loss(w, x):
    return (w * x).sum()

grads = jax.vmap(jax.value_and_grad(loss), in_axes=0)

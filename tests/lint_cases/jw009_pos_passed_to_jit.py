# expect: JW009@6
import jax

def loss(w, x):
    y = w * x
    print(y.shape, y)
    return (y**2).sum()

loss_fast = jax.jit(loss)

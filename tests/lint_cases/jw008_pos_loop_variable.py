# expect: JW008@5
import jax

def loss(w):
    return w * scale

loss_fast = jax.jit(loss)

for scale in (1.0, 2.0, 4.0):
    print(loss_fast(3.0))  # prints 3.0 three times

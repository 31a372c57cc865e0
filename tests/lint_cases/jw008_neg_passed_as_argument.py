# expect: -
import jax

learning_rate = 0.1

@jax.jit
def sgd(w, g, learning_rate):
    return w - learning_rate * g

w = sgd(1.0, 0.5, learning_rate)
learning_rate = 0.01
w = sgd(w, 0.5, learning_rate)

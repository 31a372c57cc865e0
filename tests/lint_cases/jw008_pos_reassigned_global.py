# expect: JW008@8
import jax

learning_rate = 0.1

@jax.jit
def sgd(w, g):
    return w - learning_rate * g

w = sgd(1.0, 0.5)
learning_rate = 0.01  # sgd keeps using 0.1: it was traced with it
w = sgd(w, 0.5)

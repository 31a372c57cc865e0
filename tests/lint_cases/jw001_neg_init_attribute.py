# expect: -
import jax

class Model:
    def __init__(self):
        self._apply = jax.jit(self.apply)

    def apply(self, x):
        return x + 1

    def __call__(self, x):
        return self._apply(x)

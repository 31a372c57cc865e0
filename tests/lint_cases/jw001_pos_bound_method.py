# expect: JW001@9
import jax

class Model:
    def apply(self, x):
        return x + 1

    def __call__(self, x):
        return jax.jit(self.apply)(x)

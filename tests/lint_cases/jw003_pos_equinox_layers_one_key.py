# expect: JW003@9
import equinox as eqx
import jax


class MLP(eqx.Module):
    def __init__(self, key):
        self.first = eqx.nn.Linear(4, 4, key=key)
        self.second = eqx.nn.Linear(4, 4, key=key)  # the same initial weights as `first`

    def __call__(self, x):
        return self.second(jax.nn.relu(self.first(x)))

# expect: JW003@17 JW003@18
import jax


class Noise:
    def sample(self, key, shape):
        return jax.random.normal(key, shape)


def main():
    def init(key):
        return Noise().sample(key, (3,))  # a helper of a helper

    noise = Noise()
    key = jax.random.key(0)
    a = noise.sample(key, (3,))
    b = noise.sample(key, (3,))
    c = init(key)
    return a, b, c

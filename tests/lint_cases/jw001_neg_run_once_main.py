# expect: -
import jax
import jax.numpy as jnp


def main():
    step = jax.jit(lambda w, x: w - 0.1 * x)  # created once per process
    w = jnp.ones(3)
    for _ in range(100):
        w = step(w, jnp.ones(3))
    print(w)


if __name__ == "__main__":
    main()

# expect: JW001@10
import jax
import jax.numpy as jnp


def main():
    w = jnp.ones(3)
    for epoch in range(10):
        step = jax.jit(lambda w, x: w - 0.1 * x)  # re-created every epoch
        w = step(w, jnp.ones(3))
    print(w)


if __name__ == "__main__":
    main()

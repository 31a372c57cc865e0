# expect: JW006@10
import jax
import jax.numpy as jnp


def main():
    positions = jnp.arange(8192).reshape(64, 128)

    def embed(x):
        return x + positions  # captured: a constant of the compiled program

    step = jax.jit(embed)
    return step(jnp.ones((64, 128)))


if __name__ == "__main__":
    main()

# expect: -
import jax
import jax.numpy as jnp


def main():
    positions = jnp.arange(8192)

    @jax.jit
    def embed(x, positions):
        return x + positions  # an argument: not captured

    @jax.jit
    def ramp(x):
        grid = jnp.arange(8192)  # built inside the trace: an iota, not a captured constant
        return x + grid

    small = jnp.arange(16)

    @jax.jit
    def shift(x):
        return x + small  # 16 elements: below the threshold

    return embed(jnp.ones(8192), positions), ramp(jnp.ones(8192)), shift(jnp.ones(16))


if __name__ == "__main__":
    main()

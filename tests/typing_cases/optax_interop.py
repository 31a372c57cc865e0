"""A user script mixing jaxwise.optim with Optax; `pyright` must report 0 errors on it.

jaxwise optimizers are Optax transformations: they go into ``optax.chain`` and
``optax.MultiSteps``, a jaxwise schedule goes into ``optax.adam``, and Optax pieces go into
jaxwise's ``chain``.
"""

import jax
import jax.numpy as jnp
import optax

from jaxwise import optim


def loss_fn(params: dict[str, jax.Array], x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


def main() -> None:
    schedule: optax.Schedule = optim.warmup_cosine_decay_schedule(0.0, 0.05, 5, 60, 1e-3)
    inner: optax.GradientTransformation = optax.chain(
        optim.clip_by_global_norm(1.0),
        optax.adam(schedule),
        optim.add_decayed_weights(1e-4, mask=r"^w$"),
    )
    tx: optax.GradientTransformation = optax.MultiSteps(
        inner, every_k_schedule=2
    ).gradient_transformation()
    ours_around_optax = optim.chain(optax.scale_by_rms(), optim.scale_by_learning_rate(1e-2))
    assert isinstance(ours_around_optax, optax.GradientTransformation)

    key_x, key_w = jax.random.split(jax.random.key(0))
    x = jax.random.normal(key_x, (64, 3))
    y = x @ jnp.asarray([1.0, -2.0, 0.5]) + 0.3
    params = {"w": jax.random.normal(key_w, (3,)) * 0.1, "b": jnp.zeros(())}
    state = tx.init(params)

    @jax.jit
    def step(
        params: dict[str, jax.Array], state: optax.OptState
    ) -> tuple[dict[str, jax.Array], optax.OptState, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, state = tx.update(grads, state, params)
        return optim.apply_updates(params, updates), state, loss

    first = last = float(loss_fn(params, x, y))
    for _ in range(60):
        params, state, loss = step(params, state)
        last = float(loss)
    count = optax.tree_utils.tree_get(state, "mini_step")
    print(f"loss decreased: {first:.4f} -> {last:.4f}; mini_step {int(count)}")
    assert last < first


if __name__ == "__main__":
    main()

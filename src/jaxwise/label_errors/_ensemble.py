"""The fold models trained at once in one program: `jaxwise.train`'s step, vmapped over models.

Every leaf of the `TrainState` carries a leading *model* axis. Each epoch, every model
shuffles the rows it may train on (``allowed``) with the hash of `shuffle_hash` and
takes ``min(rows allowed) // batch_size`` mini-batches (a count known only at run time, so
padded datasets of one shape share the program); one step updates every model at once with
``jax.vmap`` of the jitted function of ``train.make_step(train.value_and_grad(loss))`` (the
NaN guard and optimizer handling of every other program, through train's public names).
After each epoch every model's validation loss decides its early stopping: a model keeps its
best parameters, and once it has waited ``patience`` epochs its state no longer changes. The
loop ends when every model has stopped or after ``epochs``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxwise._shared._shuffle import shuffle_hash
from jaxwise.train import TrainState, make_step, value_and_grad

__all__ = ["ModelsFit", "fit_models"]

# (params, model_state, validation data of one model) -> scalar loss
Validate = Callable[[Any, Any, Any], jax.Array]


class ModelsFit(NamedTuple):
    """What `fit_models` returns (every leaf with a leading model axis ``M``).

    Attributes:
        params: each model's best parameters (its last ones without early stopping).
        model_state: each model's model state after training.
        best_epoch: ``(M,)`` int32, the 1-based epoch whose parameters each model kept.
        val_loss: ``(epochs, M)`` validation loss after each epoch, NaN once a model stopped
            (and for epochs never run).
        epochs_run: int32 scalar, the epochs the loop ran (the slowest model's).
    """

    params: Any
    model_state: Any
    best_epoch: jax.Array
    val_loss: jax.Array
    epochs_run: jax.Array


def _select(flag: jax.Array, new: Any, old: Any) -> Any:
    """Per-model ``where`` over two pytrees: ``flag`` is ``(M,)``, leaves ``(M, ...)``."""

    def pick(a: jax.Array, b: jax.Array) -> jax.Array:
        return jnp.where(flag.reshape(flag.shape + (1,) * (a.ndim - 1)), a, b)

    return jax.tree.map(pick, new, old)


def _orders(states: TrainState, allowed: jax.Array) -> jax.Array:
    """``(M, n)`` row order of each model: its allowed rows shuffled first, the others after."""

    def one(key: jax.Array, step: jax.Array, rows: jax.Array) -> jax.Array:
        h = shuffle_hash(key, step, rows.shape[0]) >> 1  # top bit free: allowed rows sort first
        return jnp.argsort(jnp.where(rows, h, h | jnp.uint32(0x80000000)))

    return jax.vmap(one)(states.key, states.step, allowed)


def fit_models(
    loss_fn: Callable[..., Any],
    states: TrainState,
    data: Any,
    allowed: jax.Array,
    validate: Validate,
    val_data: Any,
    *,
    batch_size: int,
    epochs: int,
    patience: int | None,
    model_state: bool = False,
) -> ModelsFit:
    """Train ``M`` models at once; call inside ``jit`` (a pure function of its arrays).

    Args:
        loss_fn: the loss of one model on one mini-batch, ``loss_fn(params, batch)`` or
            ``loss_fn(params, model_state, batch) -> (loss, model_state)`` with ``model_state``.
        states: a `TrainState` whose leaves have a leading model axis ``M``; its optimizer
            (``states.tx``) updates every model.
        data: the rows, a pytree whose leaves share the leading axis ``n`` (all models).
        allowed: ``(M, n)`` bool, the rows each model may train on (every model at least
            ``batch_size``).
        validate: ``validate(params, model_state, val) -> scalar`` of one model.
        val_data: a pytree with leading model axis ``M``: what ``validate`` gets per model.
        batch_size: rows per step per model.
        epochs: the most epochs.
        patience: a model stops after this many epochs without a lower validation loss
            (``None``: never; each model keeps its last parameters).
        model_state: as in `jaxwise.train.value_and_grad`.

    Returns:
        `ModelsFit`.
    """
    # The step's pure jitted function: no donation or audit (it runs inside the caller's jit).
    update = make_step(
        value_and_grad(loss_fn, model_state=model_state), donate=False, audit=False
    ).jitted
    models = allowed.shape[0]
    steps = jnp.min(jnp.sum(allowed, axis=1)) // batch_size
    wait = epochs + 1 if patience is None else patience

    def step(i: jax.Array, carry: tuple[TrainState, jax.Array, jax.Array]) -> tuple:
        st, order, active = carry
        idx = jax.lax.dynamic_slice_in_dim(order, i * batch_size, batch_size, axis=1)
        batch = jax.tree.map(lambda a: jnp.take(a, idx, axis=0, mode="clip"), data)
        new, _ = jax.vmap(update)(st, batch)
        return _select(active, new, st), order, active

    def epoch(carry: tuple) -> tuple:
        st, best, best_loss, best_epoch, waited, number, history = carry
        active = waited < wait
        st, _, _ = jax.lax.fori_loop(0, steps, step, (st, _orders(st, allowed), active))
        val = jax.vmap(validate)(st.params, st.model_state, val_data)
        better = active & ((val < best_loss) | (patience is None))
        best = _select(better, st.params, best)
        return (
            st,
            best,
            jnp.where(better, val, best_loss),
            jnp.where(better, number + 1, best_epoch),
            jnp.where(better, 0, waited + 1),
            number + 1,
            history.at[number].set(jnp.where(active, val, jnp.nan)),
        )

    def unfinished(carry: tuple) -> jax.Array:
        return (carry[5] < epochs) & jnp.any(carry[4] < wait)

    init = (
        states,
        states.params,
        jnp.full((models,), jnp.inf),
        jnp.zeros((models,), jnp.int32),
        jnp.zeros((models,), jnp.int32),
        jnp.zeros((), jnp.int32),
        jnp.full((epochs, models), jnp.nan),
    )
    out = jax.lax.while_loop(unfinished, epoch, init)
    return ModelsFit(out[1], out[0].model_state, out[3], out[6], out[5])

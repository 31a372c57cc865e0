"""Optax-compatible optimizers, transformations and schedules.

Same protocol as Optax — ``GradientTransformation(init, update)`` with
``update(updates, state, params=None) -> (updates, state)`` and NamedTuple
states — and the same names, signatures and argument order, so jaxwise and
Optax pieces mix inside one ``chain`` and our optimizers drop into Optax
training loops. Every hyper-parameter is validated at construction (or at
the first ``init`` for masks); schedules and step counts live inside the
compiled program.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from jaxwise import optim
    >>> params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    >>> tx = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(1e-2, mask={"w": True, "b": False}))
    >>> state = tx.init(params)
    >>> grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2) + p["b"])(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optim.apply_updates(params, updates)
"""

from jaxwise.optim._aliases import adam, adamw, lion, sgd
from jaxwise.optim._base import (
    EmptyState,
    GradientTransformation,
    apply_updates,
    chain,
    global_norm,
    identity,
    safe_increment,
    scale,
)
from jaxwise.optim._schedules import (
    constant_schedule,
    cosine_decay_schedule,
    join_schedules,
    linear_schedule,
    piecewise_constant_schedule,
    warmup_cosine_decay_schedule,
)
from jaxwise.optim._transforms import (
    AddDecayedWeightsState,
    ScaleByAdamState,
    ScaleByLionState,
    ScaleByScheduleState,
    TraceState,
    add_decayed_weights,
    clip_by_global_norm,
    freeze,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_lion,
    scale_by_schedule,
    trace,
)

__all__ = [
    "AddDecayedWeightsState",
    "EmptyState",
    "GradientTransformation",
    "ScaleByAdamState",
    "ScaleByLionState",
    "ScaleByScheduleState",
    "TraceState",
    "adam",
    "adamw",
    "add_decayed_weights",
    "apply_updates",
    "chain",
    "clip_by_global_norm",
    "constant_schedule",
    "cosine_decay_schedule",
    "freeze",
    "global_norm",
    "identity",
    "join_schedules",
    "lion",
    "linear_schedule",
    "piecewise_constant_schedule",
    "safe_increment",
    "scale",
    "scale_by_adam",
    "scale_by_learning_rate",
    "scale_by_lion",
    "scale_by_schedule",
    "sgd",
    "trace",
    "warmup_cosine_decay_schedule",
]

"""Optimizers that are Optax's, with validation and path masks added.

Every factory returns an ``optax.GradientTransformationExtraArgs`` built by Optax itself:
same math, same state types (``optax.tree_utils.tree_get(state, "count")`` works, states and
checkpoints swap with Optax's both ways), usable inside ``optax.chain``, ``optax.MultiSteps``
or ``nnx.Optimizer``. What jaxwise adds: hyper-parameters checked at construction (the error
names the argument; NumPy scalars accepted; NaN, infinity and bools rejected), masks given
as a regex over dotted leaf paths, mask errors naming the first differing path, ``freeze``
that keeps frozen parameters bit-identical, ``apply_updates`` that names a structure
difference, a ``global_norm`` accumulated in float32, and everything runnable under strict
dtype promotion.

Examples:
    >>> import jax, jax.numpy as jnp, optax
    >>> from jaxwise import optim
    >>> params = {"w": jnp.ones(3), "b": jnp.zeros(())}
    >>> tx = optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(1e-2, mask=r"^w$"))
    >>> isinstance(tx, optax.GradientTransformation)
    True
    >>> state = tx.init(params)
    >>> grads = jax.grad(lambda p: jnp.sum(p["w"] ** 2) + p["b"])(params)
    >>> updates, state = tx.update(grads, state, params)
    >>> params = optim.apply_updates(params, updates)
    >>> int(optax.tree_utils.tree_get(state, "count"))
    1
"""

from jaxwise.optim._aliases import adam, adamw, lion, sgd
from jaxwise.optim._base import (
    EmptyState,
    GradientTransformation,
    GradientTransformationExtraArgs,
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
    MaskedState,
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
    "EmptyState",
    "GradientTransformation",
    "GradientTransformationExtraArgs",
    "MaskedState",
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

"""The one update path: gradient → optimizer → parameters, NaN-guarded, model state, loss scale.

Every training program of jaxwise (a step, a scanned epoch, a DP-SGD epoch) runs
`make_update`. What differs between them is only *how a batch becomes a gradient*: a
`GradientFn` (`value_and_grad` of the user's loss, the DP-SGD gradient, one written by hand).
The optimizer is the state's own (``TrainState.tx``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxwise._shared._backends import rewrite_on
from jaxwise.optim import apply_updates, global_norm
from jaxwise.train._program._gradient import Gradients, Requirements, StepContext, requirements_of
from jaxwise.train._program._state import TrainState

__all__ = ["UpdatePlan", "initial_gradient_state", "make_update", "plan_update"]

Update = Callable[[TrainState, Any, Any], tuple[TrainState, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class UpdatePlan:
    """How `make_update` calls a gradient function (all static, read from the function).

    Attributes:
        requirements: the gradient's `Requirements` (its key, its privacy).
        init: the gradient's ``init``.
        batch_sharding: constrain the batch to this sharding, or ``None``.
    """

    requirements: Requirements
    init: Callable[[Any], Any]
    batch_sharding: Any = None

    @property
    def private(self) -> bool:
        """A private gradient: a skipped step counts (its noise was released)."""
        return self.requirements.privacy is not None


def plan_update(gradient: Any, batch_sharding: Any = None) -> UpdatePlan:
    """The `UpdatePlan` of ``gradient``."""
    return UpdatePlan(requirements_of(gradient), gradient.init, batch_sharding)


def initial_gradient_state(plan: UpdatePlan, state: TrainState) -> Any:
    """``state.gradient_state``; a ``None`` one is the gradient's empty state (no leaves).

    A state with leaves is never made here: `TrainState.create(..., gradient=...)` makes it
    once (the program refuses a ``None`` one before tracing).
    """
    if state.gradient_state is not None:
        return state.gradient_state
    return jax.eval_shape(plan.init, state.params)  # leafless: the structure is the state


def _finite_sum(tree: Any) -> jax.Array:
    """True when every element of ``tree`` is finite (a NaN or inf makes the float32 sum so)."""
    total = sum(
        (jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(tree)),
        start=jnp.zeros((), jnp.float32),
    )
    return jnp.isfinite(total)


def _apply(
    state: TrainState,
    grads: Any,
    key: Any,
    model_state: Any,
    gradient_state: Any,
    step_increment: int = 1,
):
    tx = state.tx
    assert tx is not None  # checked before tracing
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    new = dataclasses.replace(
        state,
        step=state.step + step_increment,
        params=apply_updates(state.params, updates),
        opt_state=opt_state,
        key=key,
        model_state=model_state,
        gradient_state=gradient_state,
    )
    return new, updates


def _guarded(
    state: TrainState, *new_parts: Any, step_increment: int = 1
) -> tuple[TrainState, jax.Array]:
    new, updates = _apply(state, *new_parts, step_increment=step_increment)
    ok = _finite_sum(updates)
    return jax.lax.cond(ok, lambda: new, lambda: state), ok


def _selected(
    state: TrainState, ok: jax.Array, *new_parts: Any, step_increment: int
) -> tuple[TrainState, jax.Array]:
    """`_guarded` without branches: the update always runs, ``jnp.where`` keeps the old state."""
    new, updates = _apply(state, *new_parts, step_increment=step_increment)
    ok = ok & _finite_sum(updates)
    return jax.tree.map(functools.partial(_keep, ok), new, state), ok


def _keep(ok: jax.Array, new: jax.Array, old: jax.Array) -> jax.Array:
    """``new`` where ``ok``, else ``old``; a weakly typed ``old`` stays weakly typed (a
    ``lax.cond`` for it alone, as the branching guard keeps it), so the state's type signature
    is the same on every backend."""
    if jax.typeof(old).weak_type:
        return jax.lax.cond(ok, lambda: new, lambda: old)
    return jnp.where(ok, new, old)


def _call(
    gradient: Any, plan: UpdatePlan, state: TrainState, batch: Any, key: Any, mask: Any, context
):
    given = initial_gradient_state(plan, state)
    g = gradient(state.params, state.model_state, batch, given, key=key, mask=mask, context=context)
    if not isinstance(g, Gradients):
        raise TypeError(
            f"a gradient function must return a jaxwise.train.Gradients, got {type(g).__name__}"
        )
    return g


def make_update(gradient: Any, plan: UpdatePlan) -> Callable[..., tuple[TrainState, Any]]:
    """The pure step ``update(state, batch, mask, context) -> (state, metrics)`` of every program.

    A step whose loss, gradient or *update* is not finite returns the input state
    bit-identical (the update too: ``adam(eps=0)`` turns a zero gradient into 0/0; the key
    too) and ``skipped = 1``; the gradient's state moves on (dynamic loss scaling halves its
    scale after an overflow). A private gradient's skipped step (its ``requirements.privacy``
    is set: DP noise was released) keeps the parameters, optimizer and model state but counts
    the step and moves the key on: no noise draw is used twice, a cyclic sampler's groups stay
    ``groups`` steps apart, and the step counter equals the steps the accountant counts.

    On XLA:CPU the guard is two nested ``lax.cond``: the optimizer runs only for a finite
    gradient, and its result is kept only when the update is finite (selecting every state leaf
    with ``jnp.where`` costs there up to half more run time per epoch: every leaf is copied).
    Elsewhere (the ``branching_guard`` row of ``jaxwise._shared._backends.REWRITES``) the update
    always runs and ``jnp.where`` selects the old or the new state: no ``conditional`` in the step,
    and the selects fuse into the optimizer's update. Both skip a step bit-identically; a taken step
    agrees to float32 rounding (XLA fuses the two programs differently).
    """
    private = plan.private

    def update(
        state: TrainState, batch: Any, mask: Any, context: StepContext
    ) -> tuple[TrainState, dict[str, Any]]:
        if plan.batch_sharding is not None:
            batch = jax.lax.with_sharding_constraint(batch, plan.batch_sharding)
        needs_key = plan.requirements.key
        key, step_key = jax.random.split(state.key) if needs_key else (state.key, None)
        g = _call(gradient, plan, state, batch, step_key, mask, context)
        grad_norm = global_norm(g.grads)
        metrics: dict[str, Any] = {} if g.loss is None else {"loss": g.loss}
        metrics["grad_norm"] = grad_norm
        # One NaN/inf anywhere makes the global norm non-finite: one scalar test, not per leaf.
        ok = jnp.isfinite(grad_norm)
        if g.loss is not None:
            ok = ok & jnp.isfinite(g.loss)
        gradient_state = state.gradient_state
        if gradient_state is not None or jax.tree.leaves(g.state):
            gradient_state = g.state  # a leafless state may stay None in the TrainState
        # the gradient's state moves on even when the update is skipped; a private one's step
        # and key too (its noise was released), so no noise draw is used twice; the old
        # buffers die here (no copy of them per step)
        moved = {"gradient_state": gradient_state}
        if private:
            moved.update(step=state.step + 1, key=key)
        state = state.replace(**moved)
        parts = (g.grads, key, g.model_state, gradient_state)
        increment = 0 if private else 1  # a private gradient's step was counted above
        if rewrite_on("branching_guard"):
            new, ok = jax.lax.cond(
                ok,
                functools.partial(_guarded, step_increment=increment),
                lambda s, *_: (s, jnp.zeros((), bool)),  # skipped: bit-identical state
                state,
                *parts,
            )
        else:
            new, ok = _selected(state, ok, *parts, step_increment=increment)
        metrics["skipped"] = (~ok).astype(jnp.int32)
        if g.aux is not None:
            metrics["aux"] = g.aux
        if g.metrics:
            metrics.update(g.metrics)
        return new, metrics

    return update

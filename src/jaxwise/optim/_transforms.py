"""Gradient transformations: Optax's, validated, with path masks and exact freezing."""

from __future__ import annotations

from typing import Literal, cast

import jax
import jax.numpy as jnp
import optax
from jax.typing import DTypeLike

from jaxwise._shared._checks import check_choice
from jaxwise.optim._base import (
    MaskOrFn,
    OptState,
    Params,
    Scalar,
    ScalarOrSchedule,
    Schedule,
    Updates,
    adam_moments,
    decay_rate,
    dtype_or_none,
    flag,
    hyper,
    mask_fn,
    rate_or_schedule,
    wrap,
)

ScaleByScheduleState = optax.ScaleByScheduleState
TraceState = optax.TraceState
ScaleByAdamState = optax.ScaleByAdamState
ScaleByLionState = optax.ScaleByLionState
MaskedState = optax.MaskedState


def scale_by_schedule(step_size_fn: Schedule) -> optax.GradientTransformationExtraArgs:
    """Multiply updates by ``step_size_fn(count)`` (``optax.scale_by_schedule``).

    The count is an int32 array in the state, so the schedule is evaluated inside ``jit``
    and never recompiles; it sees the pre-increment count (0 on the first update).

    Args:
        step_size_fn: a schedule: a function of the int32 step count returning a scalar.

    Returns:
        A transformation whose state is ``ScaleByScheduleState(count)``.

    Raises:
        TypeError: ``step_size_fn`` is not callable.

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_schedule(lambda count: 1.0 / (1.0 + count))
        >>> s = tx.init(None)
        >>> u, s = tx.update(jnp.ones(()), s); u2, s = tx.update(jnp.ones(()), s)
        >>> float(u), float(u2), int(s.count)
        (1.0, 0.5, 2)
    """
    if not callable(step_size_fn):
        raise TypeError(
            f"`step_size_fn` must be a schedule (a function of the step count), "
            f"got {step_size_fn!r}"
        )
    return wrap(optax.scale_by_schedule(step_size_fn))


def scale_by_learning_rate(
    learning_rate: ScalarOrSchedule | None = None, *, flip_sign: bool = True
) -> optax.GradientTransformationExtraArgs:
    """Multiply updates by ``-learning_rate`` (``optax.scale_by_learning_rate``).

    Args:
        learning_rate: a number >= 0, a schedule, or ``None`` (the identity).
        flip_sign: multiply by ``-learning_rate`` (descent) rather than ``learning_rate``.

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is Optax's own.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_learning_rate(0.1)
        >>> round(float(tx.update(jnp.ones(()), tx.init(None))[0]), 6)
        -0.1
    """
    rate = rate_or_schedule(learning_rate, "learning_rate", allow_none=True)
    return wrap(optax.scale_by_learning_rate(rate, flip_sign=flag(flip_sign, "flip_sign")))


def trace(
    decay: Scalar, nesterov: bool = False, accumulator_dtype: DTypeLike | None = None
) -> optax.GradientTransformationExtraArgs:
    """Momentum (``optax.trace``): ``t <- g + decay * t``; the update is ``t``.

    With ``nesterov=True`` the update is ``g + decay * t``.

    Args:
        decay: momentum decay in [0, 1).
        nesterov: use Nesterov momentum.
        accumulator_dtype: dtype of the trace (``None``: the params').

    Returns:
        A transformation whose state is ``TraceState(trace)``.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = trace(0.9)
        >>> u, s = tx.update(jnp.ones(()), tx.init(jnp.zeros(())))
        >>> u, s = tx.update(jnp.ones(()), s)
        >>> round(float(u), 6)
        1.9
    """
    return wrap(
        optax.trace(
            decay_rate(decay, "decay"),
            flag(nesterov, "nesterov"),
            dtype_or_none(accumulator_dtype, "accumulator_dtype"),
        )
    )


def scale_by_adam(
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Adam's rescaling with bias correction (``optax.scale_by_adam``).

    ``m <- b1 m + (1-b1) g``, ``v <- b2 v + (1-b2) g²``, ``u = m̂ / (sqrt(v̂ + eps_root) + eps)``
    with ``m̂ = m / (1 - b1ᵗ)``, ``v̂ = v / (1 - b2ᵗ)``: the first step is ``±1`` (without the
    correction it would be ``(1-b1)/sqrt(1-b2) ≈ 3.16``). ``nesterov=True`` is NAdam.

    Args:
        b1: decay rate of the first moment, in [0, 1).
        b2: decay rate of the second moment, in [0, 1).
        eps: added to the denominator's square root, >= 0.
        eps_root: added inside the square root, >= 0 (needed to differentiate through Adam).
        mu_dtype: dtype of the first moment (e.g. ``jnp.bfloat16``); ``None``: the params'.
        nesterov: use Nesterov momentum (NAdam).

    Returns:
        A transformation whose state is ``ScaleByAdamState(count, mu, nu)``.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Kingma & Ba, Adam: A Method for Stochastic Optimization, ICLR 2015,
        https://arxiv.org/abs/1412.6980

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_adam()
        >>> u, _ = tx.update(jnp.asarray([0.5, -3.0]), tx.init(jnp.zeros(2)))
        >>> [round(v, 4) for v in u.tolist()]
        [1.0, -1.0]
    """
    return wrap(
        optax.scale_by_adam(
            *adam_moments(b1, b2, eps, eps_root, mu_dtype),
            nesterov=flag(nesterov, "nesterov"),
        )
    )


def scale_by_lion(
    b1: Scalar = 0.9,
    b2: Scalar = 0.99,
    mu_dtype: DTypeLike | None = None,
    *,
    mode: Literal["hard", "smooth", "refined"] = "hard",
    smooth_beta: Scalar = 1.0,
) -> optax.GradientTransformationExtraArgs:
    """Lion's sign update (``optax.scale_by_lion``).

    The direction ``sign((1-b1) g + b1 m)`` is taken *before* the momentum update
    ``m <- (1-b2) g + b2 m``: every coordinate moves by exactly ±1 (in ``mode="hard"``).

    Args:
        b1: interpolation between the gradient and the momentum for the sign, in [0, 1).
        b2: decay rate of the momentum, in [0, 1).
        mu_dtype: dtype of the momentum (``None``: the params').
        mode: ``"hard"`` (the sign), or Optax's ``"smooth"``/``"refined"`` variants.
        smooth_beta: sharpness of the smooth sign (``mode="smooth"``), > 0.

    Returns:
        A transformation whose state is ``ScaleByLionState(count, mu)``.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Chen et al., Symbolic Discovery of Optimization Algorithms, 2023,
        https://arxiv.org/abs/2302.06675

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = scale_by_lion()
        >>> tx.update(jnp.asarray([0.001, -5.0]), tx.init(jnp.zeros(2)))[0].tolist()
        [1.0, -1.0]
    """
    check_choice(mode, "mode", ("hard", "smooth", "refined"))
    return wrap(
        optax.scale_by_lion(
            decay_rate(b1, "b1"),
            decay_rate(b2, "b2"),
            dtype_or_none(mu_dtype, "mu_dtype"),
            mode=mode,
            smooth_beta=cast(
                float, hyper(smooth_beta, "smooth_beta", min_value=0.0, min_inclusive=False)
            ),
        )
    )


def add_decayed_weights(
    weight_decay: ScalarOrSchedule = 0.0, mask: MaskOrFn | None = None
) -> optax.GradientTransformationExtraArgs:
    """Decoupled weight decay ``u <- u + weight_decay * params`` (``optax.add_decayed_weights``).

    Put it after the adaptive rescaling and before the learning rate: that is AdamW, whose
    decay is not normalised away by ``sqrt(v̂)`` as L2 + Adam's is.

    Args:
        weight_decay: a number >= 0 or a schedule of the step count.
        mask: ``None`` (every leaf), a regex searched in the dotted leaf paths (``r"\\.w$"``:
            weights only), a bool tree like the params (or a prefix of it), or a function
            ``params -> bool tree``. A tree that does not fit raises ``ValueError`` naming the
            first differing path.

    Returns:
        A transformation whose state is Optax's (``MaskedState`` when masked); ``update``
            needs ``params``.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Loshchilov & Hutter, Decoupled Weight Decay Regularization, ICLR 2019,
        https://arxiv.org/abs/1711.05101

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = add_decayed_weights(0.1, mask=r"^w$")
        >>> p = {"w": jnp.ones(()), "b": jnp.ones(())}
        >>> u, _ = tx.update({"w": jnp.zeros(()), "b": jnp.zeros(())}, tx.init(p), p)
        >>> round(float(u["w"]), 6), float(u["b"])
        (0.1, 0.0)
    """
    rate = rate_or_schedule(weight_decay, "weight_decay")
    fn = None if mask is None else mask_fn(mask)
    return wrap(optax.add_decayed_weights(rate, fn), needs_params="add_decayed_weights")


def clip_by_global_norm(max_norm: Scalar) -> optax.GradientTransformationExtraArgs:
    """Rescale all updates together to a global L2 norm of at most ``max_norm``.

    ``optax.clip_by_global_norm``.

    Args:
        max_norm: the largest global norm, > 0.

    Returns:
        A transformation with an empty state.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = clip_by_global_norm(1.0)
        >>> u, _ = tx.update({"a": jnp.asarray([3.0, 4.0])}, tx.init(None))
        >>> [round(v, 6) for v in u["a"].tolist()]
        [0.6, 0.8]
    """
    return wrap(
        optax.clip_by_global_norm(hyper(max_norm, "max_norm", min_value=0.0, min_inclusive=False))
    )


def _set_to_negative_zero() -> optax.GradientTransformation:
    # -0.0 is the exact additive identity (-0.0 + -0.0 = -0.0, where + 0.0 would flip the sign
    # bit): a frozen parameter stays bit-identical through optax.apply_updates.
    def init_fn(params: Params) -> optax.EmptyState:
        del params
        return optax.EmptyState()

    def update_fn(
        updates: Updates, state: OptState, params: Params | None = None
    ) -> tuple[Updates, OptState]:
        del params
        return jax.tree.map(lambda g: jnp.full_like(g, -0.0), updates), state

    return optax.GradientTransformation(init_fn, update_fn)


def freeze(mask: MaskOrFn) -> optax.GradientTransformationExtraArgs:
    """Zero the updates of frozen (``mask`` True) leaves, like ``optax.freeze`` (same state).

    Put it *last* in a chain: then nothing, weight decay included, moves a frozen parameter.
    The zero is ``-0.0``, so a frozen parameter stays bit-identical (``optax.freeze`` adds
    ``+0.0``, which turns a ``-0.0`` parameter into ``+0.0``).

    Args:
        mask: the frozen leaves, as in [`add_decayed_weights`][jaxwise.optim.add_decayed_weights]:
            a bool, a path regex, a bool tree (or a prefix of one) or a function
            ``params -> bool tree``.

    Returns:
        A transformation whose state is Optax's ``MaskedState``.

    Raises:
        ValueError: ``mask`` is ``None`` or an invalid regex (a tree that does not fit the
            params raises ``ValueError`` at ``init``, naming the first differing path).

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = freeze({"w": True, "b": False})
        >>> u, _ = tx.update({"w": jnp.ones(()), "b": jnp.ones(())}, tx.init({"w": 0.0, "b": 0.0}))
        >>> float(u["w"]), float(u["b"])
        (-0.0, 1.0)
    """
    return wrap(optax.masked(_set_to_negative_zero(), mask_fn(mask)))

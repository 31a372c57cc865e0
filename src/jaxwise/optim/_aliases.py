"""Ready-made optimizers: Optax's own, validated, with path-regex masks for weight decay."""

from __future__ import annotations

import optax
from jax.typing import DTypeLike

from jaxwise.optim._base import (
    MaskOrFn,
    Scalar,
    ScalarOrSchedule,
    adam_moments,
    decay_rate,
    dtype_or_none,
    flag,
    mask_fn,
    rate_or_schedule,
    wrap,
)


def sgd(
    learning_rate: ScalarOrSchedule,
    momentum: Scalar | None = None,
    nesterov: bool = False,
    accumulator_dtype: DTypeLike | None = None,
) -> optax.GradientTransformationExtraArgs:
    """SGD, optionally with (Nesterov) momentum: ``optax.sgd`` with validated arguments.

    Args:
        learning_rate: a number >= 0 or a schedule (a function of the step count).
        momentum: momentum decay in [0, 1); ``None`` for plain SGD.
        nesterov: use Nesterov momentum.
        accumulator_dtype: dtype of the momentum (``None``: the params').

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is Optax's own.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Sutskever et al., On the importance of initialization and momentum in deep learning,
        ICML 2013.

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = sgd(0.1, momentum=0.9)
        >>> round(float(tx.update(jnp.ones(()), tx.init(jnp.zeros(())))[0]), 6)
        -0.1
    """
    return wrap(
        optax.sgd(
            rate_or_schedule(learning_rate, "learning_rate"),
            None if momentum is None else decay_rate(momentum, "momentum"),
            flag(nesterov, "nesterov"),
            dtype_or_none(accumulator_dtype, "accumulator_dtype"),
        )
    )


def adam(
    learning_rate: ScalarOrSchedule,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: DTypeLike | None = None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Adam: ``optax.adam`` with validated arguments.

    Args:
        learning_rate: a number >= 0 or a schedule (a function of the step count).
        b1: decay rate of the first moment, in [0, 1).
        b2: decay rate of the second moment, in [0, 1).
        eps: added to the denominator's square root, >= 0.
        eps_root: added inside the square root, >= 0 (needed to differentiate through Adam).
        mu_dtype: dtype of the first moment (e.g. ``jnp.bfloat16``); ``None``: the params'.
        nesterov: use Nesterov momentum (NAdam).

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is Optax's own.

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Kingma & Ba, Adam: A Method for Stochastic Optimization, ICLR 2015,
        https://arxiv.org/abs/1412.6980

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = adam(1e-3)
        >>> round(float(tx.update(jnp.asarray(42.0), tx.init(jnp.zeros(())))[0]), 6)
        -0.001
    """
    return wrap(
        optax.adam(
            rate_or_schedule(learning_rate, "learning_rate"),
            *adam_moments(b1, b2, eps, eps_root, mu_dtype),
            nesterov=flag(nesterov, "nesterov"),
        )
    )


def adamw(
    learning_rate: ScalarOrSchedule,
    b1: Scalar = 0.9,
    b2: Scalar = 0.999,
    eps: Scalar = 1e-8,
    eps_root: Scalar = 0.0,
    mu_dtype: DTypeLike | None = None,
    weight_decay: ScalarOrSchedule = 1e-4,
    mask: MaskOrFn | None = None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """AdamW, Adam with decoupled weight decay: ``optax.adamw`` with validated arguments.

    The decay ``lr * weight_decay * p`` is added after Adam's rescaling, so it is not divided
    by ``sqrt(v̂)`` (what L2 + Adam gets wrong). ``mask`` may also be a regex searched in the
    dotted leaf paths, e.g. ``r"kernel"`` to decay only Flax kernels; a mask tree that does not
    fit the params raises ``ValueError`` naming the path. The state is exactly Optax's.

    Args:
        learning_rate: a number >= 0 or a schedule (a function of the step count).
        b1: decay rate of the first moment, in [0, 1).
        b2: decay rate of the second moment, in [0, 1).
        eps: added to the denominator's square root, >= 0.
        eps_root: added inside the square root, >= 0 (needed to differentiate through Adam).
        mu_dtype: dtype of the first moment (e.g. ``jnp.bfloat16``); ``None``: the params'.
        weight_decay: decay rate >= 0 (multiplied by the learning rate) or a schedule.
        mask: the leaves to decay: ``None`` (all), a regex searched in the dotted leaf paths
            (``r"kernel"``), a bool tree like the params (or a prefix of it), or a function
            ``params -> bool tree``.
        nesterov: use Nesterov momentum.

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is Optax's own.
    ``update`` needs ``params`` (the decay reads them).

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Loshchilov & Hutter, Decoupled Weight Decay Regularization, ICLR 2019,
        https://arxiv.org/abs/1711.05101

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = adamw(0.1, weight_decay=0.5)
        >>> p = jnp.asarray(2.0)
        >>> round(float(tx.update(jnp.asarray(0.0), tx.init(p), p)[0]), 6)  # pure decay
        -0.1
    """
    return wrap(
        optax.adamw(
            rate_or_schedule(learning_rate, "learning_rate"),
            *adam_moments(b1, b2, eps, eps_root, mu_dtype),
            rate_or_schedule(weight_decay, "weight_decay"),
            None if mask is None else mask_fn(mask),
            nesterov=flag(nesterov, "nesterov"),
        ),
        needs_params="adamw",
    )


def lion(
    learning_rate: ScalarOrSchedule,
    b1: Scalar = 0.9,
    b2: Scalar = 0.99,
    mu_dtype: DTypeLike | None = None,
    weight_decay: ScalarOrSchedule = 1e-3,
    mask: MaskOrFn | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Lion, sign updates with decoupled weight decay: ``optax.lion`` with validated arguments.

    Args:
        learning_rate: a number >= 0 or a schedule (a function of the step count).
        b1: interpolation between the gradient and the momentum for the sign, in [0, 1).
        b2: decay rate of the momentum, in [0, 1).
        mu_dtype: dtype of the momentum (``None``: the params').
        weight_decay: decay rate >= 0 (multiplied by the learning rate) or a schedule.
        mask: the leaves to decay: ``None`` (all), a regex searched in the dotted leaf paths
            (``r"kernel"``), a bool tree like the params (or a prefix of it), or a function
            ``params -> bool tree``.

    Returns:
        An ``optax.GradientTransformationExtraArgs`` whose state is Optax's own.
    ``update`` needs ``params`` (the decay reads them).

    Raises:
        TypeError: an argument has the wrong type (e.g. a bool, or a string for a number).
        ValueError: an argument is out of range, NaN or infinite.

    References:
        Chen et al., Symbolic Discovery of Optimization Algorithms, 2023,
        https://arxiv.org/abs/2302.06675

    Examples:
        >>> import jax.numpy as jnp
        >>> tx = lion(0.01, weight_decay=0.0)
        >>> g, p = jnp.asarray([3.0, -1e-6]), jnp.zeros(2)
        >>> [round(v, 6) for v in tx.update(g, tx.init(p), p)[0].tolist()]
        [-0.01, 0.01]
    """
    return wrap(
        optax.lion(
            rate_or_schedule(learning_rate, "learning_rate"),
            decay_rate(b1, "b1"),
            decay_rate(b2, "b2"),
            dtype_or_none(mu_dtype, "mu_dtype"),
            rate_or_schedule(weight_decay, "weight_decay"),
            None if mask is None else mask_fn(mask),
        ),
        needs_params="lion",
    )

"""Ready-made optimizers: Optax's own, validated, with path-regex masks for weight decay."""

from __future__ import annotations

from typing import Any

import optax

from jaxwise.optim._base import (
    MaskOrFn,
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
    momentum: float | None = None,
    nesterov: bool = False,
    accumulator_dtype: Any | None = None,
) -> optax.GradientTransformationExtraArgs:
    """SGD, optionally with (Nesterov) momentum: ``optax.sgd`` with validated arguments.

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
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
    *,
    nesterov: bool = False,
) -> optax.GradientTransformationExtraArgs:
    """Adam: ``optax.adam`` with validated arguments.

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
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-8,
    eps_root: float = 0.0,
    mu_dtype: Any | None = None,
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
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any | None = None,
    weight_decay: ScalarOrSchedule = 1e-3,
    mask: MaskOrFn | None = None,
) -> optax.GradientTransformationExtraArgs:
    """Lion, sign updates with decoupled weight decay: ``optax.lion`` with validated arguments.

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

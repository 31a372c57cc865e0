"""Ready-made optimizers: chains of transformations, as in Optax."""

from __future__ import annotations

from typing import Any

from jaxwise.optim._base import GradientTransformation, MaskOrFn, ScalarOrSchedule, chain, identity
from jaxwise.optim._transforms import (
    add_decayed_weights,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_lion,
    trace,
)


def _check_lr(learning_rate: Any) -> None:
    if learning_rate is None:
        raise ValueError("`learning_rate` must be a number >= 0 or a schedule, got None")


def sgd(
    learning_rate: ScalarOrSchedule,
    momentum: float | None = None,
    nesterov: bool = False,
    accumulator_dtype: Any | None = None,
) -> GradientTransformation:
    """SGD, optionally with (Nesterov) momentum (Sutskever et al., 2013).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = sgd(0.1, momentum=0.9)
        >>> round(float(tx.update(jnp.ones(()), tx.init(jnp.zeros(())))[0]), 6)
        -0.1
    """
    _check_lr(learning_rate)
    return chain(
        trace(momentum, nesterov, accumulator_dtype) if momentum is not None else identity(),
        scale_by_learning_rate(learning_rate),
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
) -> GradientTransformation:
    """Adam (Kingma & Ba, 2015): :func:`scale_by_adam` then the learning rate.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = adam(1e-3)
        >>> round(float(tx.update(jnp.asarray(42.0), tx.init(jnp.zeros(())))[0]), 6)
        -0.001
    """
    _check_lr(learning_rate)
    return chain(scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov), scale_by_learning_rate(learning_rate))


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
) -> GradientTransformation:
    """AdamW (Loshchilov & Hutter, 2019): Adam with decoupled weight decay.

    The decay ``lr · weight_decay · p`` is added after Adam's rescaling, so
    it is not divided by ``sqrt(v̂)`` (which is what L2 + Adam gets wrong).

    Example:
        >>> import jax.numpy as jnp
        >>> tx = adamw(0.1, weight_decay=0.5)
        >>> p = jnp.asarray(2.0)
        >>> round(float(tx.update(jnp.asarray(0.0), tx.init(p), p)[0]), 6)   # zero gradient: pure decay
        -0.1
    """
    _check_lr(learning_rate)
    return chain(
        scale_by_adam(b1, b2, eps, eps_root, mu_dtype, nesterov=nesterov),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )


def lion(
    learning_rate: ScalarOrSchedule,
    b1: float = 0.9,
    b2: float = 0.99,
    mu_dtype: Any | None = None,
    weight_decay: ScalarOrSchedule = 1e-3,
    mask: MaskOrFn | None = None,
) -> GradientTransformation:
    """Lion (Chen et al., 2023): sign updates with decoupled weight decay.

    Example:
        >>> import jax.numpy as jnp
        >>> tx = lion(0.01, weight_decay=0.0)
        >>> [round(v, 6) for v in tx.update(jnp.asarray([3.0, -1e-6]), tx.init(jnp.zeros(2)), jnp.zeros(2))[0].tolist()]
        [-0.01, 0.01]
    """
    _check_lr(learning_rate)
    return chain(
        scale_by_lion(b1, b2, mu_dtype),
        add_decayed_weights(weight_decay, mask),
        scale_by_learning_rate(learning_rate),
    )

"""Mixed precision: a compute dtype for the forward/backward pass and (dynamic) loss scaling.

The master weights and the optimizer state stay in their own dtype (float32): only the copy
of the parameters that the loss sees is cast to ``compute_dtype``, inside the differentiated
function, so the gradients come back in the parameters' dtype. Float16 needs loss scaling:
the loss is multiplied by a scale ``S`` before differentiation (small gradients would
otherwise underflow to zero) and the gradients divided by ``S`` after. With dynamic scaling
(Micikevicius et al., 2018) an overflow (a non-finite gradient) skips the step and halves
``S``; after ``growth_interval`` good steps in a row ``S`` doubles.

References:
  Micikevicius et al., Mixed Precision Training, ICLR 2018, https://arxiv.org/abs/1710.03740
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_float, check_int

__all__ = ["DynamicLossScale", "LossScaleState", "cast_floating"]

_COMPUTE_DTYPES = {
    np.dtype(jnp.bfloat16): "bfloat16",
    np.dtype(jnp.float16): "float16",
    np.dtype(jnp.float32): "float32",
}


class LossScaleState(NamedTuple):
    """The carried part of dynamic loss scaling (in ``TrainState.gradient_state["loss_scale"]``).

    Attributes:
        scale: float32 scalar: the current loss scale.
        good_steps: int32 scalar: finite steps in a row since the scale last changed.
    """

    scale: jax.Array  # shape=(), dtype=float32
    good_steps: jax.Array  # shape=(), dtype=int32: finite steps in a row since the last change


@dataclasses.dataclass(frozen=True)
class DynamicLossScale:
    """Configuration of dynamic loss scaling (``loss_scale="dynamic"`` uses the defaults).

    Attributes:
        initial_scale: the scale of the first step (``2**15``), > 0.
        growth_interval: finite steps in a row after which the scale is multiplied by
            ``factor``, >= 1.
        factor: growth and back-off factor (the scale is divided by it on overflow), > 1.
        min_scale: the scale never goes below this (1.0), > 0.

    Raises:
        TypeError: a field has the wrong type.
        ValueError: a field is out of range.

    Examples:
        >>> DynamicLossScale(growth_interval=100).init().scale.item()
        32768.0
    """

    initial_scale: float = 2.0**15
    growth_interval: int = 2000
    factor: float = 2.0
    min_scale: float = 1.0

    def __post_init__(self) -> None:
        check_float(self.initial_scale, "initial_scale", min_value=0.0, min_inclusive=False)
        check_int(self.growth_interval, "growth_interval", min_value=1)
        check_float(self.factor, "factor", min_value=1.0, min_inclusive=False)
        check_float(self.min_scale, "min_scale", min_value=0.0, min_inclusive=False)

    def init(self) -> LossScaleState:
        """The state of the first step: ``initial_scale`` and no good steps yet.

        Returns:
            ``LossScaleState(initial_scale, 0)``.
        """
        return LossScaleState(
            jnp.asarray(self.initial_scale, jnp.float32), jnp.zeros((), jnp.int32)
        )

    def adjust(self, state: LossScaleState, finite: jax.Array) -> LossScaleState:
        """The next state after a step whose gradients were ``finite`` (a traced bool).

        Grows the scale by ``factor`` after ``growth_interval`` finite steps in a row; divides
        it by ``factor`` (not below ``min_scale``) after a non-finite step.

        Args:
            state: the current state.
            finite: bool scalar: the step's gradients were finite.

        Returns:
            The next state.
        """
        grown = state.good_steps + 1 >= self.growth_interval
        up = jnp.where(grown, state.scale * self.factor, state.scale)
        scale = jnp.where(finite, up, jnp.maximum(state.scale / self.factor, self.min_scale))
        good = jnp.where(finite & ~grown, state.good_steps + 1, 0)
        # A scale that overflows float32 stays put rather than becoming inf.
        scale = jnp.where(jnp.isfinite(scale), scale, state.scale)
        return LossScaleState(scale.astype(jnp.float32), good.astype(jnp.int32))


def check_compute_dtype(compute_dtype: Any) -> np.dtype | None:
    """``None`` or one of bfloat16/float16/float32 as a NumPy dtype; ``TypeError`` otherwise."""
    if compute_dtype is None:
        return None
    try:
        dtype = np.dtype(compute_dtype)
    except TypeError as err:
        raise TypeError(
            f"`compute_dtype` must be None, jnp.bfloat16 or jnp.float16, got {compute_dtype!r}"
        ) from err
    if dtype not in _COMPUTE_DTYPES:
        raise TypeError(f"`compute_dtype` must be None, jnp.bfloat16 or jnp.float16, got {dtype}")
    return dtype


def check_loss_scale(
    loss_scale: Any, compute_dtype: np.dtype | None
) -> DynamicLossScale | float | None:
    """``None``, a fixed positive scale, or a `DynamicLossScale` (from ``"dynamic"``)."""
    if loss_scale is None:
        if compute_dtype == np.dtype(jnp.float16):
            raise ValueError(
                '`compute_dtype=jnp.float16` needs loss scaling: pass `loss_scale="dynamic"` (or a '
                "fixed scale); float16 gradients underflow to zero without it"
            )
        return None
    if isinstance(loss_scale, str):
        if loss_scale != "dynamic":
            raise ValueError(
                f'`loss_scale` must be None, "dynamic", a positive number or a DynamicLossScale, '
                f"got {loss_scale!r}"
            )
        return DynamicLossScale()
    if isinstance(loss_scale, DynamicLossScale):
        return loss_scale
    return check_float(loss_scale, "loss_scale", min_value=0.0, min_inclusive=False)


def cast_floating(tree: Any, dtype: Any) -> Any:
    """Cast every floating leaf of ``tree`` to ``dtype`` (integer, bool and key leaves untouched).

    Examples:
        >>> import jax.numpy as jnp
        >>> out = cast_floating({"w": jnp.ones(2), "label": jnp.zeros(2, jnp.int32)}, jnp.bfloat16)
        >>> str(out["w"].dtype), str(out["label"].dtype)
        ('bfloat16', 'int32')
    """
    if dtype is None:
        return tree

    def cast(x: Any) -> Any:
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return jnp.asarray(x).astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def cast_like(tree: Any, like: Any) -> Any:
    """Cast every leaf of ``tree`` back to the dtype of the matching leaf of ``like``."""
    return jax.tree.map(
        lambda x, ref: jnp.asarray(x).astype(ref.dtype) if hasattr(ref, "dtype") else x, tree, like
    )

"""How a batch becomes a gradient: the `GradientFn` protocol and its builders.

Every training program of jaxwise (a step, a scanned epoch, a DP-SGD epoch) is a gradient
function composed with the one update path (`make_step`/`make_epoch`). A gradient function is
any callable ``gradient(params, model_state, batch, *, key, mask) -> Gradients``;
`value_and_grad` builds one from a loss, `mixed_precision` wraps one in a compute dtype with
loss scaling, `jaxwise.privacy.dp_gradient_fn` is the DP-SGD one. One that keeps state
across steps (noise buffers, an adaptive clip norm) is a `StatefulGradientFn`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxwise._checks import check_bool, check_callable
from jaxwise._loss_output import describe, unpack_loss_output
from jaxwise.train._precision import (
    DynamicLossScale,
    cast_floating,
    cast_like,
    check_compute_dtype,
    check_loss_scale,
)
from jaxwise.train._sampler import Sampler

__all__ = [
    "GradientFn",
    "Gradients",
    "MixedPrecision",
    "SamplerAware",
    "SamplerChecked",
    "StatefulGradientFn",
    "ValueAndGrad",
    "gradient_loss",
    "mixed_precision",
    "needs_key",
    "value_and_grad",
]


class Gradients(NamedTuple):
    """What a gradient function returns for one batch.

    Attributes:
        grads: a pytree like ``params``.
        loss: the float32 scalar loss, or ``None`` when the gradient function computes none.
        model_state: the new model state (the old one when the model has none).
        aux: the loss's auxiliary output (``None`` without one); programs report it in
            ``metrics["aux"]``.
        metrics: extra scalar metrics of this step (a dict), or ``None``.
        state: a `StatefulGradientFn`'s new state (``None`` for a stateless one).
    """

    grads: Any
    loss: jax.Array | None
    model_state: Any
    aux: Any = None
    metrics: dict[str, jax.Array] | None = None
    state: Any = None


@runtime_checkable
class GradientFn(Protocol):
    """``gradient(params, model_state, batch, *, key, mask) -> Gradients``, traced per step.

    ``key`` is a fresh typed key split from ``TrainState.key`` every step (``None`` when the
    gradient needs none, as `value_and_grad` without ``with_key``); ``mask`` is a bool
    ``(B,)`` of the batch's real rows (a padded Poisson batch) or ``None`` when every row is
    real. Write one by hand to change how a batch becomes a gradient (a regulariser, a
    different estimator): the programs add the NaN guard, donation, meshes and the scan.
    """

    def __call__(
        self, params: Any, model_state: Any, batch: Any, *, key: jax.Array | None, mask: Any
    ) -> Gradients:
        """One batch's gradient.

        Args:
            params: the parameters.
            model_state: the model state (``None`` without one).
            batch: the batch, a pytree of arrays with a leading example axis.
            key: a fresh key, or ``None``.
            mask: bool ``(B,)`` real rows, or ``None``.

        Returns:
            The batch's `Gradients`.
        """
        ...


@runtime_checkable
class StatefulGradientFn(Protocol):
    """A gradient function with state carried across steps (in ``TrainState.gradient_state``).

    ``init(params)`` returns the initial state (a pytree of arrays); the programs call the
    function with an extra keyword ``state=`` and keep ``Gradients.state`` as the new one.
    The state is donated, scanned through the epoch and checkpointed with the `TrainState`.
    """

    def init(self, params: Any) -> Any:
        """The state before the first step.

        Args:
            params: the parameters.

        Returns:
            A pytree of arrays.
        """
        ...

    def __call__(
        self,
        params: Any,
        model_state: Any,
        batch: Any,
        *,
        key: jax.Array | None,
        mask: Any,
        state: Any,
    ) -> Gradients:
        """One batch's gradient and the new state (in ``Gradients.state``).

        Args:
            params: the parameters.
            model_state: the model state.
            batch: the batch.
            key: a fresh key.
            mask: bool ``(B,)`` real rows, or ``None``.
            state: the current state.

        Returns:
            The batch's `Gradients`, ``state`` set.
        """
        ...


@runtime_checkable
class SamplerAware(Protocol):
    """A gradient function that depends on the epoch's sampler (e.g. DP-SGD's denominator).

    `make_epoch` calls ``for_sampler(sampler, n)`` once per trace and runs the gradient
    function it returns (DP-SGD divides the noisy sum by the sampler's *expected* batch size,
    a data-independent constant: ``sampler.sample_rate(n) * n``, or one group's expected batch
    for a sampler that draws each step from one group of the data).
    """

    def for_sampler(self, sampler: Sampler, n: int) -> GradientFn:
        """The gradient function for epochs of ``sampler`` over ``n`` examples.

        Args:
            sampler: the epoch's sampler.
            n: the number of examples.

        Returns:
            A gradient function of the same kind.
        """
        ...


@runtime_checkable
class SamplerChecked(Protocol):
    """A gradient function that only some samplers may feed (e.g. correlated DP noise).

    `make_epoch` calls ``check_sampler(sampler)`` once, when the epoch is made, so a pairing
    the gradient cannot be trained with (BandMF's noise with a sampler that may put an
    example in two nearby steps) is refused before anything is compiled or run.
    """

    def check_sampler(self, sampler: Sampler) -> None:
        """Refuse a sampler this gradient function cannot be trained with.

        Args:
            sampler: the epoch's sampler.

        Raises:
            ValueError: the pairing is not allowed (the message names both and the fix).
        """
        ...


def _check_scalar(loss: Any, name: str) -> None:
    if not (
        hasattr(loss, "shape") and loss.shape == () and jnp.issubdtype(loss.dtype, jnp.floating)
    ):
        shape = getattr(loss, "shape", None)
        raise TypeError(
            f"{name} must return a floating scalar loss, got {describe(loss)}"
            + (f" (shape {tuple(shape)})" if shape else "")
        )


@dataclasses.dataclass(frozen=True)
class ValueAndGrad:
    """``jax.value_and_grad`` of a loss as a `GradientFn`; made by `value_and_grad`.

    Attributes:
        loss: the loss.
        has_aux: the loss returns an auxiliary output.
        model_state: the loss takes and returns the model state.
        with_key: the loss takes a trailing key.
    """

    loss: Callable[..., Any]
    has_aux: bool = False
    model_state: bool = False
    with_key: bool = False

    def __call__(
        self, params: Any, model_state: Any, batch: Any, *, key: jax.Array | None, mask: Any
    ) -> Gradients:
        """The loss and its gradient on ``batch`` (``mask`` unused: the loss sees the batch).

        Args:
            params: the parameters.
            model_state: the model state (passed to the loss with ``model_state=True``).
            batch: the batch.
            key: a fresh key (passed to the loss with ``with_key=True``).
            mask: unused.

        Returns:
            `Gradients` with ``loss``, ``grads``, the new model state and ``aux``.
        """
        del mask  # the plain loss sees whole batches
        return self._cast(params, model_state, batch, key, None, None)

    def _cast(
        self, params: Any, old_state: Any, batch: Any, key: Any, dtype: Any, scale: Any
    ) -> Gradients:
        """The gradient computed in ``dtype`` with the loss multiplied by ``scale``.

        The parameters and the floating leaves of the batch are cast inside the
        differentiated function, so the gradients come back in the parameters' own dtype.
        The model state is passed in its stored dtype and the new one cast back to it.
        """
        name = f"`loss_fn` `{getattr(self.loss, '__name__', type(self.loss).__name__)}`"

        def scaled_loss(p: Any) -> tuple[jax.Array, tuple[Any, Any, Any]]:
            args: tuple[Any, ...] = (cast_floating(p, dtype),)
            if self.model_state:
                args += (old_state,)  # stored dtype: only the computation is cast
            args += (cast_floating(batch, dtype),)
            if self.with_key:
                args += (key,)
            loss, new_state, aux = unpack_loss_output(
                self.loss(*args), model_state=self.model_state, has_aux=self.has_aux, name=name
            )
            _check_scalar(loss, name)
            loss = loss.astype(jnp.float32)
            return (loss if scale is None else loss * scale), (loss, new_state, aux)

        (_, (loss, new_state, aux)), grads = jax.value_and_grad(scaled_loss, has_aux=True)(params)
        if scale is not None:
            grads = jax.tree.map(lambda g: (g.astype(jnp.float32) / scale).astype(g.dtype), grads)
        new_state = cast_like(new_state, old_state) if self.model_state else old_state
        return Gradients(grads, loss, new_state, aux)


def value_and_grad(
    loss: Callable[..., Any],
    *,
    has_aux: bool = False,
    model_state: bool = False,
    with_key: bool = False,
) -> ValueAndGrad:
    """The gradient function of a loss: ``jax.value_and_grad`` on each batch.

    Args:
        loss: ``loss(params, batch) -> scalar``; ``loss(params, model_state, batch) ->
            (scalar, new_model_state)`` with ``model_state``; ``(loss, aux)`` (or ``(loss,
            (new_model_state, aux))``) with ``has_aux``; a trailing ``key`` argument with
            ``with_key``.
        has_aux: the loss returns an auxiliary output, reported in ``metrics["aux"]``.
        model_state: thread ``TrainState.model_state`` (BatchNorm statistics...) through it.
        with_key: pass a fresh key split from ``TrainState.key`` every step.

    Returns:
        A `ValueAndGrad` (a `GradientFn`).

    Raises:
        TypeError: ``loss`` is not callable or a flag is not a bool.

    Examples:
        >>> import jax.numpy as jnp
        >>> g = value_and_grad(lambda w, x: jnp.sum(w * x))
        >>> g(jnp.ones(2), None, jnp.asarray([3.0, 4.0]), key=None, mask=None).grads.tolist()
        [3.0, 4.0]
    """
    check_callable(loss, "loss")
    for flag, value in (("has_aux", has_aux), ("model_state", model_state), ("with_key", with_key)):
        check_bool(value, flag)
    return ValueAndGrad(loss, bool(has_aux), bool(model_state), bool(with_key))


@dataclasses.dataclass(frozen=True)
class MixedPrecision:
    """A gradient function run in a compute dtype, with loss scaling; made by `mixed_precision`.

    Attributes:
        gradient: the wrapped gradient function.
        compute_dtype: the forward/backward dtype (NumPy dtype).
        loss_scale: a fixed scale, a `DynamicLossScale` (its state lives in
            ``TrainState.loss_scale``), or ``None``.
    """

    gradient: GradientFn
    compute_dtype: np.dtype
    loss_scale: DynamicLossScale | float | None = None

    def __call__(
        self,
        params: Any,
        model_state: Any,
        batch: Any,
        *,
        key: jax.Array | None,
        mask: Any,
        loss_scale: jax.Array | None = None,
    ) -> Gradients:
        """The wrapped gradient in ``compute_dtype``.

        Args:
            params: the parameters (float32 master weights).
            model_state: the model state (kept in its stored dtype).
            batch: the batch (floating leaves cast).
            key: a fresh key, or ``None``.
            mask: bool ``(B,)`` real rows, or ``None``.
            loss_scale: the current dynamic scale (the programs pass ``TrainState``'s).

        Returns:
            `Gradients` in the parameters' dtypes.
        """
        scale = loss_scale
        if scale is None and not isinstance(self.loss_scale, DynamicLossScale):
            scale = self.loss_scale
        if isinstance(self.gradient, ValueAndGrad):
            return self.gradient._cast(params, model_state, batch, key, self.compute_dtype, scale)
        g = self.gradient(
            cast_floating(params, self.compute_dtype),
            model_state,
            cast_floating(batch, self.compute_dtype),
            key=key,
            mask=mask,
        )
        return g._replace(grads=cast_like(g.grads, params))


def mixed_precision(
    gradient: GradientFn,
    *,
    compute_dtype: DTypeLike,
    loss_scale: float | str | DynamicLossScale | None = None,
) -> MixedPrecision:
    """``gradient`` with its forward/backward pass in ``compute_dtype`` (bfloat16 or float16).

    The master weights, the optimizer state and the model state keep their dtype; only the
    copy of the parameters and the floating batch leaves that the loss sees are cast. Float16
    needs loss scaling (Micikevicius et al., 2018, https://arxiv.org/abs/1710.03740):
    ``"dynamic"`` keeps its scale in ``TrainState.loss_scale``, reports it in
    ``metrics["loss_scale"]`` and skips a step that overflows.

    Args:
        gradient: a gradient function; loss scaling needs one from `value_and_grad`.
        compute_dtype: ``jnp.bfloat16``, ``jnp.float16`` (or ``jnp.float32``).
        loss_scale: ``"dynamic"``, a `DynamicLossScale`, a fixed positive scale, or ``None``.

    Returns:
        A `MixedPrecision` (a `GradientFn`).

    Raises:
        TypeError: ``gradient`` is not a stateless gradient function, or a bad
            ``compute_dtype``.
        ValueError: float16 without loss scaling, an unknown ``loss_scale``, or loss scaling
            of a gradient not built by `value_and_grad`.

    Examples:
        >>> import jax.numpy as jnp
        >>> g = mixed_precision(value_and_grad(lambda w, x: jnp.sum(w * x)),
        ...                     compute_dtype=jnp.bfloat16)
        >>> g(jnp.ones(2), None, jnp.ones(2), key=None, mask=None).grads.dtype
        dtype('float32')
    """
    if not callable(gradient) or isinstance(gradient, StatefulGradientFn):
        raise TypeError(
            f"`gradient` must be a stateless gradient function, got {type(gradient).__name__}"
        )
    dtype = check_compute_dtype(compute_dtype)
    if dtype is None:
        raise TypeError("`compute_dtype` must be jnp.bfloat16, jnp.float16 or jnp.float32")
    scale = check_loss_scale(loss_scale, dtype)
    if scale is not None and not isinstance(gradient, ValueAndGrad):
        raise ValueError(
            "`loss_scale` needs a gradient built by `jaxwise.train.value_and_grad` (the loss is "
            f"scaled before differentiation), got {type(gradient).__name__}"
        )
    return MixedPrecision(gradient, dtype, scale)


def needs_key(gradient: Any) -> bool:
    """Whether the programs split a fresh key for ``gradient`` every step."""
    if isinstance(gradient, ValueAndGrad):
        return gradient.with_key
    if isinstance(gradient, MixedPrecision):
        return needs_key(gradient.gradient)
    return True


def gradient_loss(gradient: Any) -> Any:
    """The user's loss inside ``gradient`` (to name the program), else ``gradient`` itself."""
    if isinstance(gradient, MixedPrecision):
        return gradient_loss(gradient.gradient)
    loss = getattr(gradient, "loss", None)
    return loss if callable(loss) else gradient

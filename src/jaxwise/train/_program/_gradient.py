"""How a batch becomes a gradient: the one `GradientFn` protocol and its builders.

Every training program of jaxwise (a step, a scanned epoch, a DP-SGD epoch) is a gradient
function composed with the one update path (`make_step`/`make_epoch`). A gradient function
has ``init(params) -> state`` (``()`` when it keeps none) and is called ``gradient(params,
model_state, batch, state, *, key, mask, context) -> Gradients`` with ``Gradients.state`` the
new state, as Optax's ``GradientTransformation`` always carries a state. ``context`` is a
`StepContext`: the facts the program knows about the step (the expected batch size, the
sampler's rate and separation, the compute dtype and loss scale), passed explicitly on every
call, so a wrapper that forwards the call forwards them too. What it needs of the program (a
key, a sampler separation, how its privacy is accounted) it states in its ``requirements``
(a `Requirements`), which a wrapper forwards. `value_and_grad` builds one from a loss,
`mixed_precision` wraps one in a compute dtype and loss scaling, `jaxwise.privacy.dp_gradient_fn`
is the DP-SGD one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import DTypeLike

from jaxwise._shared._blame import user_loss
from jaxwise._shared._checks import check_bool, check_callable
from jaxwise._shared._loss_output import describe, unpack_loss_output
from jaxwise._typing import GradientState, Params, PyTree
from jaxwise.train._program._precision import (
    DynamicLossScale,
    LossScaleState,
    cast_floating,
    cast_like,
    check_compute_dtype,
    check_loss_scale,
)
from jaxwise.train._program._sampling import SamplingFacts

__all__ = [
    "GradientFn",
    "Gradients",
    "MixedPrecision",
    "PrivacyClaim",
    "Requirements",
    "StepContext",
    "ValueAndGrad",
    "gradient_loss",
    "mixed_precision",
    "requirements_of",
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
        state: the gradient function's new state (``()`` for one that keeps none).
    """

    grads: Any
    loss: jax.Array | None
    model_state: Any
    aux: Any = None
    metrics: dict[str, jax.Array] | None = None
    state: Any = ()


@runtime_checkable
class PrivacyClaim(Protocol):
    """What a private gradient function's privacy needs of the epoch's sampler.

    A DP gradient's ``requirements.privacy`` (`jaxwise.privacy.DPAccounting`): `make_epoch`
    calls ``check_sampler(sampler.facts(None), name)`` when the epoch is made, whatever wraps
    the gradient, and the accountant reads the same object (``dp_event``).
    """

    def check_sampler(self, facts: SamplingFacts, name: str = "the sampler") -> None:
        """Refuse a sampling the privacy accounting does not cover.

        Args:
            facts: the epoch's sampler's `SamplingFacts` (its ``min_separation`` is read).
            name: the sampler's name, for the message.

        Raises:
            ValueError: the pairing is not covered (a `jaxwise.privacy.PairingError`).
        """
        ...


@dataclasses.dataclass(frozen=True)
class Requirements:
    """What a gradient function needs of the program that runs it (its ``requirements``).

    Every gradient function declares one (``Requirements()`` for none). A wrapper forwards its
    wrapped gradient's (``return self.inner.requirements``): a DP gradient refuses, by name, a
    call whose ``context.privacy`` is not its own.

    Attributes:
        key: split a fresh key for it every step (``False``: ``key=None``).
        privacy: how its privacy is accounted (a `PrivacyClaim`), ``None`` when it is not
            private. A private gradient's step counts even when the NaN guard skips its
            update (its noise was released): the step, the key and the state move on.
        precision: it applies ``context.compute_dtype`` and ``context.loss_scale`` itself
            (`mixed_precision` only sets them; else it casts around the call, no loss scale).
        mask: it honours the sampler's ``mask`` (padding rows change neither its loss nor its
            gradient). A padded sampler (Poisson) refuses a gradient without it: a batch-mean
            loss would average the zero padding rows in.
        widths: it runs a padded step at the step's width (``context.widths``) itself, on the
            batch at the widest: the DP gradient switches only its clipping, its noise is
            compiled once (otherwise the whole gradient is compiled once per width).
    """

    key: bool = True
    privacy: PrivacyClaim | None = None
    precision: bool = False
    mask: bool = False
    widths: bool = False


@dataclasses.dataclass(frozen=True)
class StepContext:
    """The facts the program knows about a step, passed to the gradient on every call.

    Attributes:
        expected_batch_size: the sampler's expected batch size (a data-independent constant;
            a DP gradient divides its noisy sum by it), or the batch's rows under `make_step`.
        sample_rate: the sampler's ``sample_rate(n)``, ``None`` under `make_step`.
        min_separation: the fewest steps between two batches that hold one example, as the
            sampler guarantees it (``None`` under `make_step`: the caller's batches).
        sampler: the sampler's name (for messages).
        privacy: the privacy the program accounts for this gradient (the outermost
            gradient's ``requirements.privacy``); ``None`` for a non-private program.
        compute_dtype: the forward/backward dtype (``None``: the parameters').
        loss_scale: the loss scale (a float32 scalar or float), or ``None``.
        gradient: the name of the program's (outermost) gradient, whose ``init`` made the
            state: for messages (a wrapper whose ``init`` drops the wrapped state is named).
        widths: a padded step's widths (``requirements.widths``; ``()``: the batch's rows).
        width_index: the index into ``widths`` of this step's width (traced), or ``None``.
    """

    expected_batch_size: float
    sample_rate: float | None = None
    min_separation: int | None = None
    sampler: str = "make_step's batches"
    privacy: PrivacyClaim | None = None
    compute_dtype: np.dtype | None = None
    loss_scale: jax.Array | float | None = None
    gradient: str = "the gradient"
    widths: tuple[int, ...] = ()
    width_index: jax.Array | None = None


def requirements_of(gradient: object) -> Requirements:
    """``gradient.requirements``: a member every `GradientFn` declares.

    Args:
        gradient: a gradient function.

    Returns:
        Its `Requirements`.

    Raises:
        TypeError: it has no ``requirements``, or they are not a `Requirements`.
    """
    name = type(gradient).__name__
    try:
        req = gradient.requirements  # pyright: ignore[reportAttributeAccessIssue]
    except AttributeError as err:
        raise TypeError(
            f"`{name}` declares no `requirements`, a member of jaxwise.train.GradientFn: "
            "a gradient states what it needs of the program (`requirements = "
            "jaxwise.train.Requirements()` for none) and a wrapper forwards the wrapped "
            "gradient's (`return self.inner.requirements`)"
        ) from err
    if not isinstance(req, Requirements):
        raise TypeError(
            f"`{name}.requirements` must be a jaxwise.train.Requirements, got {type(req).__name__}"
        )
    return req


@runtime_checkable
class GradientFn(Protocol):
    """The one gradient protocol: ``requirements``, ``init(params) -> state`` and a call.

    ``gradient(params, model_state, batch, state, *, key, mask, context) -> Gradients``, traced
    per step. ``state`` is the function's state (``TrainState.gradient_state``, ``()`` for a
    function that keeps none) and ``Gradients.state`` the new one; ``key`` is a fresh typed
    key split from ``TrainState.key`` every step (``None`` when its ``requirements`` say it
    needs none); ``mask`` is a bool ``(B,)`` of the batch's real rows (a padded Poisson batch)
    or ``None``; ``context`` the step's `StepContext`. ``requirements`` (a `Requirements`)
    states what it needs of the program: a key, its privacy claim, whether it applies the
    compute dtype, whether it honours a mask. Write one by hand to change how a batch becomes
    a gradient (a regulariser, an extra metric, a different estimator); a wrapper forwards
    the three members (``requirements``, ``init``, the call with its ``state`` and
    ``context``) to the function it wraps, and is then trained, refused and accounted alike.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jaxwise.train import Gradients, value_and_grad
        >>> class WithL2:
        ...     def __init__(self, inner):
        ...         self.inner = inner
        ...     @property
        ...     def requirements(self):
        ...         return self.inner.requirements
        ...     def init(self, params):
        ...         return self.inner.init(params)
        ...     def __call__(self, params, model_state, batch, state, *, key, mask, context):
        ...         g = self.inner(params, model_state, batch, state, key=key, mask=mask,
        ...                        context=context)
        ...         return g._replace(grads=g.grads + 1e-3 * params)
        >>> isinstance(WithL2(value_and_grad(lambda w, x: jnp.sum(w * x))), GradientFn)
        True
    """

    @property
    def requirements(self) -> Requirements:
        """What the gradient needs of the program (``Requirements()``: nothing).

        Returns:
            Its `Requirements`.
        """
        ...

    def init(self, params: Params) -> GradientState:
        """The state before the first step.

        Args:
            params: the parameters.

        Returns:
            A pytree of arrays (``()`` for none).
        """
        ...

    def __call__(
        self,
        params: PyTree,
        model_state: PyTree,
        batch: PyTree,
        state: PyTree,
        *,
        key: jax.Array | None,
        mask: jax.Array | None,
        context: StepContext,
    ) -> Gradients:
        """One batch's gradient and the new state (in ``Gradients.state``).

        Args:
            params: the parameters.
            model_state: the model state (``None`` without one).
            batch: the batch, a pytree of arrays with a leading example axis.
            state: the current state.
            key: a fresh key, or ``None``.
            mask: bool ``(B,)`` real rows, or ``None``.
            context: the step's facts.

        Returns:
            The batch's `Gradients`.
        """
        ...


def _check_scalar(loss: Any, name: str) -> None:
    shape = getattr(loss, "shape", None)
    if shape == () and jnp.issubdtype(loss.dtype, jnp.floating):
        return
    shown = f" (shape {tuple(shape)})" if shape else ""
    raise TypeError(f"{name} must return a floating scalar loss, got {describe(loss)}{shown}")


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

    @property
    def requirements(self) -> Requirements:
        """A key only ``with_key``; it applies the compute dtype and loss scale itself."""
        return Requirements(key=self.with_key, precision=True)

    def init(self, params: Params) -> tuple[()]:
        """No state: ``()``.

        Args:
            params: the parameters (unused).

        Returns:
            ``()``.
        """
        del params
        return ()

    def __call__(
        self,
        params: Any,
        model_state: Any,
        batch: Any,
        state: Any,
        *,
        key: jax.Array | None,
        mask: jax.Array | None,
        context: StepContext,
    ) -> Gradients:
        """The loss and its gradient on ``batch`` (``mask`` unused: the loss sees the batch).

        Args:
            params: the parameters.
            model_state: the model state (passed to the loss with ``model_state=True``).
            batch: the batch.
            state: ``()``.
            key: a fresh key (passed to the loss with ``with_key=True``).
            mask: unused.
            context: its ``compute_dtype`` and ``loss_scale`` are applied.

        Returns:
            `Gradients` with ``loss``, ``grads``, the new model state and ``aux``.
        """
        del mask  # the plain loss sees whole batches
        g = self._cast(params, model_state, batch, key, context.compute_dtype, context.loss_scale)
        return g._replace(state=state)

    def _cast(
        self, params: Any, old_state: Any, batch: Any, key: Any, dtype: Any, scale: Any
    ) -> Gradients:
        """The gradient computed in ``dtype`` with the loss multiplied by ``scale``.

        The parameters and the floating leaves of the batch are cast inside the
        differentiated function, so the gradients come back in the parameters' own dtype.
        The model state is passed in its stored dtype and the new one cast back to it.
        """
        name = f"`loss` `{getattr(self.loss, '__name__', type(self.loss).__name__)}`"
        takes_state = self.model_state
        loss_fn = user_loss(self.loss)  # its errors are marked as the loss's (train._step)

        def scaled_loss(p: Any) -> tuple[jax.Array, tuple[Any, Any, Any]]:
            args: tuple[Any, ...] = (cast_floating(p, dtype),)
            if takes_state:
                args += (old_state,)  # stored dtype: only the computation is cast
            args += (cast_floating(batch, dtype),)
            if self.with_key:
                args += (key,)
            loss, new_state, aux = unpack_loss_output(
                loss_fn(*args), model_state=takes_state, has_aux=self.has_aux, name=name
            )
            _check_scalar(loss, name)
            loss = loss.astype(jnp.float32)
            return (loss if scale is None else loss * scale), (loss, new_state, aux)

        (_, (loss, new_state, aux)), grads = jax.value_and_grad(scaled_loss, has_aux=True)(params)
        if scale is not None:
            grads = jax.tree.map(lambda g: (g.astype(jnp.float32) / scale).astype(g.dtype), grads)
        new_state = cast_like(new_state, old_state) if takes_state else old_state
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
        A `ValueAndGrad` (a `GradientFn` without state).

    Raises:
        TypeError: ``loss`` is not callable or a flag is not a bool.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jaxwise.train import StepContext
        >>> g = value_and_grad(lambda w, x: jnp.sum(w * x))
        >>> out = g(jnp.ones(2), None, jnp.asarray([3.0, 4.0]), (), key=None, mask=None,
        ...         context=StepContext(expected_batch_size=2))
        >>> out.grads.tolist()
        [3.0, 4.0]
    """
    check_callable(loss, "loss")
    for flag, value in (("has_aux", has_aux), ("model_state", model_state), ("with_key", with_key)):
        check_bool(value, flag)
    return ValueAndGrad(loss, bool(has_aux), bool(model_state), bool(with_key))


@dataclasses.dataclass(frozen=True)
class MixedPrecision:
    """A gradient function run in a compute dtype, with loss scaling; made by `mixed_precision`.

    Its state is ``{"gradient": the wrapped function's state, "loss_scale": a
    `LossScaleState` with dynamic scaling, else ()}``.

    Attributes:
        gradient: the wrapped gradient function.
        compute_dtype: the forward/backward dtype (NumPy dtype).
        loss_scale: a fixed scale, a `DynamicLossScale`, or ``None``.
    """

    gradient: GradientFn
    compute_dtype: np.dtype
    loss_scale: DynamicLossScale | float | None = None

    @property
    def requirements(self) -> Requirements:
        """The wrapped gradient's (its key and its privacy: this wrapper releases nothing)."""
        return requirements_of(self.gradient)

    @property
    def loss(self) -> Callable[..., Any]:
        """The user's loss inside the wrapped gradient (it names the program)."""
        return gradient_loss(self.gradient)

    def init(self, params: Params) -> dict[str, Any]:
        """``{"gradient": the wrapped state, "loss_scale": the dynamic scale's or ()}``.

        Args:
            params: the parameters.

        Returns:
            The state before the first step.
        """
        scaler = self._scaler
        scale: Any = () if scaler is None else scaler.init()
        return {"gradient": self.gradient.init(params), "loss_scale": scale}

    @property
    def _scaler(self) -> DynamicLossScale | None:
        """The dynamic loss scale (``None`` for a fixed one or none)."""
        scale = self.loss_scale
        return None if scale is None or isinstance(scale, (int, float)) else scale

    def __call__(
        self,
        params: Any,
        model_state: Any,
        batch: Any,
        state: Any,
        *,
        key: jax.Array | None,
        mask: jax.Array | None,
        context: StepContext,
    ) -> Gradients:
        """The wrapped gradient in ``compute_dtype``.

        Args:
            params: the parameters (float32 master weights).
            model_state: the model state (kept in its stored dtype).
            batch: the batch (floating leaves cast).
            state: ``{"gradient": ..., "loss_scale": ...}``.
            key: a fresh key, or ``None``.
            mask: bool ``(B,)`` real rows, or ``None``.
            context: the step's facts (passed on with the dtype and scale set).

        Returns:
            `Gradients` in the parameters' dtypes; with dynamic scaling ``metrics`` has
                ``"loss_scale"`` (this step's) and the scale adjusts (halved after an
                overflow, which the NaN guard skips).
        """
        scaler = self._scaler
        scaling: LossScaleState | None = None if scaler is None else state["loss_scale"]
        scale: Any = self.loss_scale if scaling is None else scaling.scale
        inner = dataclasses.replace(context, compute_dtype=self.compute_dtype, loss_scale=scale)
        if requirements_of(self.gradient).precision:
            g = self.gradient(
                params, model_state, batch, state["gradient"], key=key, mask=mask, context=inner
            )
        else:  # cast around a gradient that does not apply the dtype itself
            g = self.gradient(
                cast_floating(params, self.compute_dtype),
                model_state,
                cast_floating(batch, self.compute_dtype),
                state["gradient"],
                key=key,
                mask=mask,
                context=dataclasses.replace(inner, compute_dtype=None, loss_scale=None),
            )
            g = g._replace(grads=cast_like(g.grads, params))
        new_scale: Any = state["loss_scale"]
        metrics = g.metrics
        if scaler is not None and scaling is not None:
            ok = _finite(g.grads) if g.loss is None else _finite(g.grads) & jnp.isfinite(g.loss)
            new_scale = scaler.adjust(scaling, ok)
            metrics = {**(metrics or {}), "loss_scale": scaling.scale}
        return g._replace(state={"gradient": g.state, "loss_scale": new_scale}, metrics=metrics)


def _finite(tree: Any) -> jax.Array:
    """True when every element of ``tree`` is finite (one float32 sum)."""
    total = sum(
        (jnp.sum(leaf.astype(jnp.float32)) for leaf in jax.tree.leaves(tree)),
        start=jnp.zeros((), jnp.float32),
    )
    return jnp.isfinite(total)


def mixed_precision(
    gradient: GradientFn,
    *,
    compute_dtype: DTypeLike,
    loss_scale: float | str | DynamicLossScale | None = None,
) -> MixedPrecision:
    """``gradient`` with its forward/backward pass in ``compute_dtype`` (bfloat16 or float16).

    The master weights, the optimizer state and the model state keep their dtype; only the
    copy of the parameters and the floating batch leaves that the loss sees are cast (inside
    the differentiated function for a gradient whose ``requirements.precision`` says it
    applies the dtype itself: `value_and_grad`, `jaxwise.privacy.dp_gradient_fn`). Float16
    needs loss scaling (Micikevicius et al., 2018, https://arxiv.org/abs/1710.03740):
    ``"dynamic"`` keeps its scale in the gradient's state (``TrainState.gradient_state
    ["loss_scale"]``; create the state with ``TrainState.create(..., gradient=...)``),
    reports it in ``metrics["loss_scale"]`` and skips a step that overflows. Wrapping a DP
    gradient keeps its state, its normalisation and its accounting (the wrapper forwards its
    ``requirements``).

    Args:
        gradient: a gradient function; loss scaling needs one that applies the scale itself
            (`value_and_grad`).
        compute_dtype: ``jnp.bfloat16``, ``jnp.float16`` (or ``jnp.float32``).
        loss_scale: ``"dynamic"``, a `DynamicLossScale`, a fixed positive scale, or ``None``.

    Returns:
        A `MixedPrecision` (a `GradientFn`).

    Raises:
        TypeError: ``gradient`` is not a gradient function, or a bad ``compute_dtype``.
        ValueError: float16 without loss scaling, an unknown ``loss_scale``, or loss scaling
            of a gradient that does not apply the scale itself.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jaxwise.train import StepContext
        >>> g = mixed_precision(value_and_grad(lambda w, x: jnp.sum(w * x)),
        ...                     compute_dtype=jnp.bfloat16)
        >>> out = g(jnp.ones(2), None, jnp.ones(2), g.init(jnp.ones(2)), key=None, mask=None,
        ...         context=StepContext(expected_batch_size=2))
        >>> out.grads.dtype
        dtype('float32')
    """
    check_gradient_fn(gradient)
    dtype = check_compute_dtype(compute_dtype)
    if dtype is None:
        raise TypeError("`compute_dtype` must be jnp.bfloat16, jnp.float16 or jnp.float32")
    scale = check_loss_scale(loss_scale, dtype)
    if scale is not None and not requirements_of(gradient).precision:
        raise ValueError(
            "`loss_scale` needs a gradient that scales its loss before differentiation (one "
            "whose `requirements.precision` is True, e.g. `jaxwise.train.value_and_grad`), got "
            f"{type(gradient).__name__}"
        )
    return MixedPrecision(gradient, dtype, scale)


def check_gradient_fn(gradient: object, what: str = "gradient") -> None:
    """``TypeError`` unless ``gradient`` is a `GradientFn` (a call, ``init``, ``requirements``)."""
    if not (callable(gradient) and callable(getattr(gradient, "init", None))):
        raise TypeError(
            f"`{what}` must be a gradient function (jaxwise.train.GradientFn: `requirements`, "
            "`init(params)` and `__call__(params, model_state, batch, state, *, key, mask, "
            f"context)`), got {type(gradient).__name__}; build one from a loss with "
            "`jaxwise.train.value_and_grad(loss)`"
        )
    requirements_of(gradient)


def gradient_loss(gradient: object) -> Any:
    """The user's loss inside ``gradient`` (to name the program), else ``gradient`` itself."""
    loss = getattr(gradient, "loss", None)
    return loss if callable(loss) else gradient

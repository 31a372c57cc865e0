"""The one DP gradient: `dp_step` behind `dp_gradient` (functional) and `dp_gradient_fn`.

`dp_step` clips every example's gradient, sums, adds the step's noise once (through a
`NoiseMechanism`) and divides by the expected batch size; a `ClipPolicy` moves the clip norm.
`dp_gradient` runs it on one batch with the state passed in and out; `DPGradientFn` (made by
`dp_gradient_fn`) runs it as a `jaxwise.train.GradientFn`, its privacy (`DPAccounting`)
stated in its ``requirements`` and checked against the program's ``context``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from jaxwise._shared._blame import user_loss
from jaxwise._shared._checks import check_bool, check_callable, check_float, check_key
from jaxwise._shared._losses import (
    ChunkSize,
    Method,
    batch_size_of,
    check_chunk,
    check_clip_norm,
    check_method,
)
from jaxwise._typing import Batch, GradientState, ModelState, Params
from jaxwise.privacy._mechanisms._noise import (
    DPGradient,
    check_noise,
    check_noise_scale,
    clipped_sum,
    flat_zeros,
    noise_step,
    noisy_mean,
)
from jaxwise.privacy._mechanisms._protocols import (
    ClipPolicy,
    DPAccounting,
    NoiseMechanism,
    PairingError,
    _pairing_message,
    check_dp_events,
    clip_policy,
    issue,
)
from jaxwise.privacy._state import NO_MODEL_STATE
from jaxwise.train import Gradients, Requirements, StepContext

__all__ = ["DPGradientFn", "DPOptions", "dp_gradient", "dp_gradient_fn", "dp_step"]


@dataclasses.dataclass(frozen=True)
class DPGradientFn:
    """The DP-SGD gradient function (a `jaxwise.train.GradientFn`); made by `dp_gradient_fn`.

    Attributes:
        loss: the per-example loss.
        clip_norm: ``C`` (a float) or a `ClipPolicy`.
        noise_multiplier: ``σ``: the noise std is ``σ·C``.
        method: the per-example clipping method.
        chunk_size: the chunk size of the ``"vmap"``/``"chunked"`` methods.
        takes_model_state: the loss takes and returns the model state.
        freeze_model_state: BatchNorm layers of adapted models run in inference mode.
        noise: a `NoiseMechanism`, or ``None`` for independent Gaussian noise.
        accounting: its `DPAccounting` (``requirements.privacy``), made with it.
    """

    loss: Callable[..., Any]
    clip_norm: float | ClipPolicy
    noise_multiplier: float
    method: Method = "auto"
    chunk_size: ChunkSize = None
    takes_model_state: bool = False
    freeze_model_state: bool = False
    noise: NoiseMechanism | None = None
    accounting: DPAccounting = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        accounting = issue(DPAccounting(self.noise_multiplier, self.noise, self.clip_norm))
        object.__setattr__(self, "accounting", accounting)

    @property
    def options(self) -> DPOptions:
        """The options of `dp_step` (clip, noise, clipping method)."""
        return DPOptions(
            self.clip_norm,
            self.noise_multiplier,
            self.noise,
            self.method,
            self.chunk_size,
            self.freeze_model_state,
        )

    @property
    def requirements(self) -> Requirements:
        """A key every step, its `DPAccounting`; it applies the compute dtype, honours the mask
        and runs a padded step at its width itself (the noise is drawn once, not per width)."""
        return Requirements(
            key=True, privacy=self.accounting, precision=True, mask=True, widths=True
        )

    def init(self, params: Params) -> dict[str, Any]:
        """``{"noise": mechanism state, "clip": policy state}`` (``()`` for an absent part).

        Args:
            params: the parameters.

        Returns:
            The state before the first step.
        """
        noise = () if self.noise is None else self.noise.init(flat_zeros(params))
        policy = clip_policy(self.clip_norm)
        clip = () if policy is None else policy.init()
        return {"noise": noise, "clip": clip}

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
        """One batch's DP gradient, its clipping metrics and the new state.

        Args:
            params: the parameters.
            model_state: the model state (used with ``takes_model_state``).
            batch: the examples (leading axis ``B``).
            state: ``{"noise": ..., "clip": ...}``.
            key: this step's key (one normal draw: the noise and a `ClipPolicy`'s own).
            mask: bool ``(B,)`` real examples, or ``None``.
            context: the step's facts: the noisy sum is divided by its
                ``expected_batch_size``; its ``privacy`` must be this gradient's own.

        Returns:
            `Gradients` without a loss; metrics ``grad_norm_mean``, ``clipped_fraction``,
            ``batch_size`` (and ``clip_norm`` under a `ClipPolicy`).

        Raises:
            ValueError: no ``key``; a ``context`` that does not account this gradient's
                privacy (a wrapper that does not forward ``requirements``); a loss scale.
            PairingError: the context's sampler separates participations less than the
                mechanism assumes.
        """
        self._check_context(context)
        _check_state(state, context)  # rails: a wrapper's init that drops the state, named
        if key is None:
            raise ValueError("the DP gradient needs a `key` for its noise")
        given = model_state if self.takes_model_state else NO_MODEL_STATE
        grads, norms, new_model_state, new_state, clip = dp_step(
            self._cast_loss(context),
            params,
            given,
            batch,
            state,
            key=key,
            mask=mask,
            options=self.options,
            expected_batch_size=context.expected_batch_size,
            width=None if context.width_index is None else (context.width_index, context.widths),
        )
        metrics = clip_metrics(norms, mask, clip, policy=clip_policy(self.clip_norm) is not None)
        kept = new_model_state if self.takes_model_state else model_state
        return Gradients(grads, None, kept, None, metrics, new_state)

    def _check_context(self, context: Any) -> None:
        if not isinstance(context, StepContext):
            raise TypeError(
                f"the DP gradient needs `context`, a jaxwise.train.StepContext, got "
                f"{type(context).__name__}"
            )
        if context.privacy is not self.accounting:
            raise ValueError(
                f"the DP gradient was called by a program that accounts {context.privacy!r}, not "
                f"its own {self.accounting!r}: a wrapper around a DP gradient must forward its "
                "`requirements` (`return self.inner.requirements`), or the ε reported would "
                "not be this gradient's"
            )
        have = context.min_separation
        if have is not None and have < self.accounting.min_separation:
            raise PairingError(_pairing_message(self.noise, context.sampler, have))
        if context.loss_scale is not None:
            raise ValueError(
                "the DP gradient applies no loss scaling (its per-example clipping would need "
                "the unscaled norms): use mixed_precision(..., compute_dtype=jnp.bfloat16) "
                "without `loss_scale`"
            )

    def _cast_loss(self, context: StepContext) -> Callable[..., Any]:
        """The loss with the parameters and the example cast to ``context.compute_dtype``."""
        dtype = context.compute_dtype
        if dtype is None:
            return self.loss
        loss = self.loss

        def cast(params: Any, *rest: Any) -> Any:
            *state, example = rest
            return loss(_cast_floating(params, dtype), *state, _cast_floating(example, dtype))

        cast.__name__ = getattr(loss, "__name__", "loss")
        return cast


def _check_state(state: Any, context: StepContext) -> None:
    """``TypeError`` naming the program gradient's ``init`` unless ``state`` is a DP state."""
    if isinstance(state, dict) and set(state) == {"noise", "clip"}:
        return
    raise TypeError(
        f"the DP gradient got the state {type(state).__name__} {state!r:.60}, not the "
        "{'noise': ..., 'clip': ...} its `init` returns: "
        f"`{context.gradient}.init` must return the wrapped gradient's state "
        "(`return self.inner.init(params)`, or a structure the wrapper unpacks in its call)"
    )


def _cast_floating(tree: Any, dtype: Any) -> Any:
    """Every floating leaf of ``tree`` cast to ``dtype`` (integer, bool and key leaves kept)."""

    def cast(x: Any) -> Any:
        if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype:
            return jnp.asarray(x).astype(dtype)
        return x

    return jax.tree.map(cast, tree)


def clip_metrics(
    norms: jax.Array, mask: jax.Array | None, clip: Any, *, policy: bool
) -> dict[str, jax.Array]:
    """``grad_norm_mean``, ``clipped_fraction``, ``batch_size`` (and ``clip_norm``) of a step."""
    real = jnp.ones(norms.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
    count = jnp.maximum(real.sum(), 1.0)
    metrics = {
        "grad_norm_mean": jnp.sum(norms * real) / count,
        "clipped_fraction": jnp.sum((norms > clip).astype(jnp.float32) * real) / count,
        "batch_size": jnp.sum(real).astype(jnp.int32),
    }
    if policy:
        metrics["clip_norm"] = jnp.asarray(clip, jnp.float32)
    return metrics


class DPOptions(NamedTuple):
    """What `dp_step` clips and noises with (the fields of `DPGradientFn` but the loss).

    Attributes:
        clip_norm: ``C`` or a `ClipPolicy`.
        noise_multiplier: ``σ``.
        noise: the `NoiseMechanism`, or ``None``.
        method: the per-example clipping method.
        chunk_size: its chunk size.
        freeze_model_state: BatchNorm of adapted models in inference mode.
    """

    clip_norm: float | ClipPolicy
    noise_multiplier: float
    noise: NoiseMechanism | None = None
    method: Method = "auto"
    chunk_size: ChunkSize = None
    freeze_model_state: bool = False


def dp_step(
    loss: Callable[..., Any],
    params: Any,
    model_state: Any,
    batch: Any,
    state: Any,
    *,
    key: jax.Array,
    mask: jax.Array | None,
    options: DPOptions,
    expected_batch_size: Any,
    width: tuple[jax.Array, tuple[int, ...]] | None = None,
) -> tuple[Any, jax.Array, Any, dict[str, Any], Any]:
    """THE DP gradient: clip, sum, noise once (through ``noise``), divide; the policy's update.

    `DPGradientFn` and the functional `dp_gradient` both run this. With ``width`` (``(index,
    widths)``: a padded step whose real rows come first) only the clipping runs at
    ``widths[index]`` rows (a ``lax.switch``, its norms padded back with zeros); the noise,
    the metrics and the policy's update run once, at the batch's width.

    Returns:
        ``(noisy mean gradient, norms (B,), new model state or None, new state
        {"noise", "clip"}, this step's clip norm)``.
    """
    o = options
    if callable(loss):  # (a loss that is not callable is refused by name below)
        loss = user_loss(loss)  # its errors are marked as the loss's (train._step names them)
    policy = clip_policy(o.clip_norm)
    clip: Any = o.clip_norm if policy is None else policy.norm(state["clip"])

    def clipped(rows: Any, real: Any) -> tuple[Any, jax.Array, Any]:
        return _clipped(loss, params, model_state, rows, real, clip, o)

    if width is None:
        summed, norms, new_model_state = clipped(batch, mask)
    else:
        summed, norms, new_model_state = _at_width(clipped, batch, mask, width)
    new_state = dict(state)
    std = o.noise_multiplier * clip if o.noise_multiplier else 0.0
    # the one noising step (`privacy.privatizer`'s), then the division by the expected size
    noisy, new_state["noise"], normals = noise_step(
        summed,
        key,
        state["noise"],
        noise=o.noise,
        std=std,
        noisy=bool(o.noise_multiplier),
        extra=1 if policy is not None else 0,
    )
    grads = noisy_mean(noisy, None, 0.0, expected_batch_size)
    if policy is not None:
        assert normals is not None  # drawn whenever there is a policy
        normal = normals[0]
        new_state["clip"] = policy.update(state["clip"], norms, mask, normal, expected_batch_size)
    return grads, norms, new_model_state, new_state, clip


def _at_width(
    clipped: Callable[[Any, Any], tuple[Any, jax.Array, Any]],
    batch: Any,
    mask: Any,
    width: tuple[jax.Array, tuple[int, ...]],
) -> tuple[Any, jax.Array, Any]:
    """``clipped(batch, mask)`` of the first ``widths[index]`` rows: a ``lax.switch`` branch per
    width, the norms padded back with zeros to the batch's rows."""
    index, widths = width
    if mask is None or mask.shape[0] != widths[-1]:
        got = None if mask is None else mask.shape[0]
        raise ValueError(
            f"a DP step at a padded width needs the step's whole padded batch ({widths[-1]} rows "
            f"and their mask), got {got}: a wrapper that forwards `requirements.widths` must "
            "hand the batch and the mask on whole (or declare `widths=False`)"
        )
    rows = mask.shape[0]

    def at(w: int) -> Callable[[], tuple[Any, jax.Array, Any]]:
        def run() -> tuple[Any, jax.Array, Any]:
            summed, norms, new_state = clipped(jax.tree.map(lambda a: a[:w], batch), mask[:w])
            return summed, jnp.pad(norms, (0, rows - w)), new_state

        return run

    return jax.lax.switch(index, [at(w) for w in widths])


def _clipped(
    loss: Callable[..., Any],
    params: Any,
    model_state: Any,
    batch: Any,
    mask: Any,
    clip: Any,
    o: DPOptions,
) -> tuple[Any, jax.Array, Any]:
    """The clipped sum at ``clip`` (a traced norm: clip ``loss / C`` at 1, rescale)."""
    options: dict[str, Any] = dict(
        method=o.method,
        chunk_size=o.chunk_size,
        mask=mask,
        model_state=model_state,
        freeze_model_state=o.freeze_model_state,
    )
    if isinstance(clip, float):
        return clipped_sum(loss, params, batch, clip_norm=clip, **options)
    with_state = model_state is not NO_MODEL_STATE

    def scaled(*args: Any) -> Any:
        out = loss(*args)
        if with_state:
            return out[0] / clip, out[1]
        return out / clip

    summed, norms, new_state = clipped_sum(scaled, params, batch, clip_norm=1.0, **options)
    return jax.tree.map(lambda g: g * clip.astype(g.dtype), summed), norms * clip, new_state


def dp_gradient(
    loss: Callable[..., Any],
    params: Params,
    batch: Batch,
    key: jax.Array,
    *,
    clip_norm: float | ClipPolicy,
    noise_multiplier: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    mask: jax.Array | None = None,
    expected_batch_size: float | None = None,
    model_state: ModelState = NO_MODEL_STATE,
    freeze_model_state: bool = False,
    noise: NoiseMechanism | None = None,
    state: GradientState = None,
) -> DPGradient:
    """The DP-SGD gradient of one batch, `dp_gradient_fn`'s computation bit for bit.

    Model state: state computed from the examples (BatchNorm statistics) is refused with a
    ``ValueError`` naming it, per-example-safe state (RNG streams, counters) advances.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example (with ``model_state``:
            ``loss(params, model_state, example) -> (scalar, new_model_state)``).
        params: the parameters, any pytree of float arrays.
        batch: the examples, any pytree whose leaves share a leading example axis ``B``.
        key: PRNG key for the noise.
        clip_norm: ``C``, or a [`ClipPolicy`][jaxwise.privacy.ClipPolicy] (norm in ``state``).
        noise_multiplier: ``σ``: the noise std is ``σ·C``.
        method: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        chunk_size: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        mask: optional bool ``(B,)``: real examples of a padded Poisson batch.
        expected_batch_size: the denominator; default ``B``. Pass ``q·N`` with Poisson batches.
        model_state: the model's non-trainable state (omit it for a loss without one).
        freeze_model_state: run BatchNorm layers of adapted models in inference mode.
        noise: a [`NoiseMechanism`][jaxwise.privacy.NoiseMechanism], or ``None`` (DP-SGD).
        state: the previous step's ``DPGradient.state``; ``None``: the first step's.

    Returns:
        A [`DPGradient`][jaxwise.privacy.DPGradient]: ``grads`` like ``params``, the
            ``(B,)`` pre-clip ``norms``, the new ``model_state`` (``None`` without one) and
            the new ``state`` (``{"noise": ..., "clip": ...}``).

    Raises:
        TypeError: a bad ``loss``, ``params``, ``batch``, ``key``, ``noise`` or flag.
        ValueError: a bad ``clip_norm``/``noise_multiplier``, batch leaves that do not
            share their leading dimension, or model state (or a layer) that mixes examples.

    Examples:
        >>> import jax, jax.numpy as jnp; loss = lambda w, x: jnp.sum(w * x)
        >>> g, norms, _, _ = dp_gradient(loss, jnp.ones(2), jnp.asarray([[3.0, 4.0], [0.0, 1.0]]),
        ...                           jax.random.key(0), clip_norm=1.0, noise_multiplier=0.0)
        >>> [round(v, 4) for v in g.tolist()], norms.tolist()
        ([0.3, 0.9], [5.0, 1.0])
        >>> def counted(w, count, x):  # model state: a step counter
        ...     return jnp.sum(w * x), count + 1
        >>> _, _, count, _ = dp_gradient(counted, jnp.ones(2), jnp.ones((3, 2)),
        ...     jax.random.key(0), clip_norm=1.0, noise_multiplier=0.0, model_state=jnp.int32(0))
        >>> int(count)
        1
    """
    options = _dp_options(clip_norm, noise_multiplier, noise, method, chunk_size)
    options = options._replace(freeze_model_state=freeze_model_state)
    check_key(key)
    divisor = _divisor(batch, expected_batch_size)
    if state is None:  # the first step's: the mechanism's and the policy's init
        state = DPGradientFn(loss, options.clip_norm, options.noise_multiplier, noise=noise)
        state = state.init(params)
    args = (loss, params, model_state, batch, state)
    out = dp_step(*args, key=key, mask=mask, options=options, expected_batch_size=divisor)
    return DPGradient(*out[:4])


def _divisor(batch: Any, expected_batch_size: Any) -> Any:
    """The expected batch size given, checked, or the batch's rows."""
    if expected_batch_size is None:
        return batch_size_of(batch)
    name = "expected_batch_size"
    check_float(expected_batch_size, name, min_value=0.0, min_inclusive=False, allow_traced=True)
    return expected_batch_size


def _dp_options(
    clip_norm: Any, noise_multiplier: Any, noise: Any, method: Any, chunk_size: Any
) -> DPOptions:
    """The checked options of `dp_gradient` and `dp_gradient_fn` (a float ``C``, or a policy)."""
    check_noise(noise_multiplier)
    if not isinstance(clip_norm, ClipPolicy):
        check_clip_norm(clip_norm)
        check_noise_scale(clip_norm, noise_multiplier)
        clip_norm = float(clip_norm)
    check_method(method)
    check_chunk(chunk_size)
    if noise is not None and not isinstance(noise, NoiseMechanism):
        raise TypeError(
            "`noise` must be None or a jaxwise.privacy.NoiseMechanism (init, correlate, "
            f"min_separation, dp_event), got {type(noise).__name__}"
        )
    check_dp_events(noise, clip_policy(clip_norm))  # rails: a dp_event that returns no event
    return DPOptions(clip_norm, float(noise_multiplier), noise, method, chunk_size)


def dp_gradient_fn(
    loss: Callable[..., Any],
    *,
    clip_norm: float | ClipPolicy,
    noise_multiplier: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    takes_model_state: bool = False,
    freeze_model_state: bool = False,
    noise: NoiseMechanism | None = None,
) -> DPGradientFn:
    """The DP-SGD gradient as a gradient function for `jaxwise.train.make_epoch`/`make_step`.

    Each step clips every real example's gradient to norm ``C`` (ghost clipping or
    micro-batched per-example gradients, whichever is cheaper on the backend, see
    [`clip_plan`][jaxwise.per_example.clip_plan]), sums, adds
    ``noise_multiplier · C · noise`` (one standard-normal draw over all parameters,
    transformed by ``noise``) and divides by the epoch sampler's *expected* batch size
    (the batch's rows under `make_step`), exactly as
    [`dp_gradient`][jaxwise.privacy.dp_gradient] (Abadi et al., 2016,
    https://arxiv.org/abs/1607.00133). Model state is as in ``dp_gradient``: per-example-safe
    state advances, state computed from the examples is refused with a ``ValueError``.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example; with
            ``takes_model_state=True`` ``loss(params, model_state, example) -> (scalar,
            new_model_state)``.
        clip_norm: ``C > 0``, or a [`ClipPolicy`][jaxwise.privacy.ClipPolicy].
        noise_multiplier: ``σ >= 0``.
        method: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        chunk_size: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        takes_model_state: the loss takes and returns the model state.
        freeze_model_state: run BatchNorm layers of adapted models in inference mode.
        noise: a [`NoiseMechanism`][jaxwise.privacy.NoiseMechanism], or ``None`` for
            independent Gaussian noise (DP-SGD).

    Returns:
        A [`DPGradientFn`][jaxwise.privacy.DPGradientFn] with ``clip_norm``,
            ``noise_multiplier`` and ``noise`` for the accountant.

    Raises:
        TypeError: a bad ``loss``, option type or ``noise``.
        ValueError: a bad ``clip_norm``, ``noise_multiplier``, ``method`` or
            ``chunk_size``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> from jaxwise.privacy import PoissonSampler
        >>> from jaxwise.train import TrainState, make_epoch
        >>> def sq(w, example): return (jnp.dot(w, example["x"]) - example["y"]) ** 2
        >>> data = {"x": jnp.ones((64, 3)), "y": jnp.ones(64)}
        >>> gradient = dp_gradient_fn(sq, clip_norm=1.0, noise_multiplier=1.1)
        >>> epoch = make_epoch(gradient, PoissonSampler(16))
        >>> state, metrics = epoch(TrainState.create(jnp.zeros(3), optim.sgd(0.1), 0), data)
        >>> int(state.step), gradient.noise_multiplier
        (4, 1.1)
    """
    check_callable(loss, "loss")
    options = _dp_options(clip_norm, noise_multiplier, noise, method, chunk_size)
    check_bool(takes_model_state, "takes_model_state")
    check_bool(freeze_model_state, "freeze_model_state")
    return DPGradientFn(
        loss,
        options.clip_norm,
        options.noise_multiplier,
        method,
        chunk_size,
        bool(takes_model_state),
        bool(freeze_model_state),
        noise,
    )

"""DP-SGD as a gradient function: clipping policies and noise mechanisms plug into it.

`dp_gradient_fn` returns a `DPGradientFn`, a `jaxwise.train.GradientFn`: each step clips
every example's gradient to norm ``C``, sums, adds ``noise_multiplier · C · noise`` and
divides by the expected batch size the program passes in its ``context``. ``noise`` comes
from a `NoiseMechanism` (``None``: independent Gaussian noise, DP-SGD) that turns this
step's standard-normal draw ``z`` into the noise (correlated across steps for
matrix-factorization mechanisms); ``C`` from a float or a `ClipPolicy` (adaptive
clipping). Its state, ``{"noise": mechanism state, "clip": policy state}`` (``()`` for an
absent part), lives in ``TrainState.gradient_state``.

A mechanism states the participation its accounting assumes (``min_separation``: an example
joins at most once in that many steps) and a `SeparatedSampler` the separation it guarantees;
`make_epoch` refuses a pairing where the sampler guarantees less with a `PairingError`. The
gradient's privacy travels with it: its ``requirements.privacy`` is a `DPAccounting` (the
noise multiplier, the mechanism and the clip policy), which a wrapper forwards, which
`make_epoch` checks against the sampler and which the accountant composes (each mechanism
and clip policy gives its own ``dp_event``). A call whose ``context.privacy`` is not the
gradient's own (a wrapper that hides it) is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from jaxwise._checks import check_bool, check_callable, check_float, check_key
from jaxwise._errors import JaxwiseError
from jaxwise._losses import (
    ChunkSize,
    Method,
    batch_size_of,
    check_chunk,
    check_clip_norm,
    check_method,
)
from jaxwise.privacy._noise import (
    DPGradient,
    check_noise,
    check_noise_scale,
    clipped_sum,
    flat_normal,
    flat_size,
    flat_zeros,
    noisy_mean,
    unflatten_like,
)
from jaxwise.privacy._state import NO_MODEL_STATE
from jaxwise.train import Gradients, Requirements, Sampler, StepContext

__all__ = [
    "ClipPolicy",
    "DPAccounting",
    "DPGradientFn",
    "NoiseMechanism",
    "PairingError",
    "SeparatedSampler",
    "add_noise",
    "check_pairing",
    "clip_policy",
    "dp_gradient",
    "dp_gradient_fn",
]


class PairingError(JaxwiseError, ValueError):
    """A noise mechanism paired with a sampler its privacy accounting does not cover.

    BandMF's amplified accounting assumes every example joins at most once every ``bands``
    steps (BLT: every ``min_sep`` steps); a sampler that may put an example in two closer
    steps (Poisson, shuffled batches) voids the guarantee, so the pairing is refused when
    the epoch is made.

    Examples:
        >>> issubclass(PairingError, ValueError)
        True
    """

    __module__ = "jaxwise.privacy"


@runtime_checkable
class NoiseMechanism(Protocol):
    """How a step's standard-normal draw becomes its noise (``None`` in `dp_gradient_fn`: z).

    ``init(params)`` is the state before the first step (a pytree of arrays, e.g. the
    buffers of earlier draws); ``correlate(state, z)`` returns ``(noise, new_state)`` with
    ``noise`` a tree like ``z``, for a unit clip norm and unit noise multiplier: the gradient
    adds ``noise_multiplier · C · noise``. `dp_gradient_fn` passes the whole draw as ONE flat
    vector (the parameters' ``P`` entries padded to a multiple of 8, their common dtype;
    ``init`` gets zeros of that shape; the padding's noise is dropped), so a mechanism written
    for any tree costs a few operations per step whatever the number of leaves.
    ``min_separation`` is the fewest steps between two participations of one example that its
    accounting assumes (1: any sampler); `make_epoch` refuses a sampler that guarantees fewer
    (`PairingError`). ``dp_event(release, sample_rate=, steps=)`` is its accounting: a
    ``dp_accounting`` ``DpEvent`` of the whole run, built from ``release(k)``, the event of
    one release of the noisy gradient covering ``k`` participations of an example (the
    gradient's Gaussian, merged with a clip policy's own release): DP-SGD is
    ``SelfComposedDpEvent(PoissonSampledDpEvent(sample_rate, release(1)), steps)``.
    """

    @property
    def min_separation(self) -> int:
        """Steps between two participations of an example that the accounting assumes.

        Returns:
            An int >= 1.
        """
        ...

    def init(self, params: Any) -> Any:
        """The state before the first step.

        Args:
            params: a tree like the draws ``z`` (for the shapes of buffers).

        Returns:
            A pytree of arrays (``()`` for none).
        """
        ...

    def correlate(self, state: Any, z: Any) -> tuple[Any, Any]:
        """This step's noise from its standard-normal draw.

        Args:
            state: the mechanism's state.
            z: a standard-normal tree like ``params``.

        Returns:
            ``(noise, new_state)``.
        """
        ...

    def dp_event(self, release: Callable[[int], Any], *, sample_rate: float, steps: int) -> Any:
        """The accounting event of ``steps`` steps.

        Args:
            release: ``release(k)``: the event of one release covering ``k`` participations.
            sample_rate: the sampler's rate (one group's for a cyclic sampler).
            steps: the noisy steps.

        Returns:
            A ``dp_accounting.DpEvent``.

        Raises:
            ValueError: ``steps`` beyond what the mechanism's sensitivity covers.
        """
        ...


@runtime_checkable
class SeparatedSampler(Protocol):
    """A sampler that guarantees a minimum separation between an example's participations.

    ``min_separation`` steps at least lie between two batches holding the same example
    (`PoissonSampler`: 1; ``CyclicPoissonSampler(groups=g)``: ``g``). A sampler that is not
    one (``train.ShuffleSampler``) guarantees 1.
    """

    @property
    def min_separation(self) -> int:
        """The fewest steps between two participations of one example.

        Returns:
            An int >= 1.
        """
        ...


def _separation(sampler: Any) -> int:
    return int(sampler.min_separation) if isinstance(sampler, SeparatedSampler) else 1


def _pairing_message(noise: Any, sampler: str, have: int) -> str:
    need = 1 if noise is None else int(noise.min_separation)
    return (
        f"`noise` {noise} needs every example to join at most once every {need} steps "
        f"(its privacy accounting assumes it), but `sampler` {sampler} "
        f"guarantees {have}: train it with privacy.CyclicPoissonSampler(batch_size, "
        f"groups={need}) (or more groups)"
    )


def check_pairing(noise: NoiseMechanism | None, sampler: Any) -> None:
    """`PairingError` unless ``sampler`` separates participations as ``noise`` assumes.

    Args:
        noise: the noise mechanism (``None``: DP-SGD, any sampler).
        sampler: the epoch's sampler.

    Raises:
        PairingError: the sampler guarantees fewer steps between an example's
            participations than the mechanism's ``min_separation``.
    """
    need = 1 if noise is None else int(noise.min_separation)
    have = _separation(sampler)
    if have < need:
        raise PairingError(_pairing_message(noise, type(sampler).__name__, have))


def add_noise(
    summed: Any,
    z: jax.Array | None,
    state: Any,
    *,
    noise: NoiseMechanism | None,
    std: Any,
    batch_size: Any,
) -> tuple[Any, Any]:
    """``((summed + std · noise) / batch_size, new mechanism state)``: the one noising step.

    ``z`` is the step's standard-normal draw over all parameters as ONE flat vector padded to
    a multiple of 8 (`flat_normal`, `flat_size`), turned into this step's noise by
    ``noise.correlate`` (``None``: ``z`` itself, DP-SGD bit for bit) and then sliced per
    leaf; ``z = None`` (``σ = 0``) adds none and leaves the state as it is. A mechanism works
    on the flat vector, so its cost is a few operations whatever the number of leaves.

    Args:
        summed: the sum of clipped per-example gradients (a pytree of float arrays).
        z: ``(flat_size(summed),)`` standard normals (the first ``P``, the entries of
            ``summed``, are used), or ``None``.
        state: the mechanism's state (``()`` for ``noise=None``).
        noise: a `NoiseMechanism`, or ``None``.
        std: ``σ·C`` (a float, or a traced scalar under an adaptive clip).
        batch_size: the divisor (the expected batch size).

    Returns:
        ``(noisy mean like summed, new state)``.
    """
    if z is None:
        return noisy_mean(summed, None, 0.0, batch_size), state
    flat: Any = z
    if noise is not None:
        flat, state = noise.correlate(state, z)
    return noisy_mean(summed, unflatten_like(flat, summed), std, batch_size), state


def _draw(
    key: jax.Array, summed: Any, *, gradient: bool, clip: bool
) -> tuple[jax.Array | None, jax.Array | None]:
    """``(z (flat_size,) or None, a float32 scalar or None)``: ONE standard-normal draw.

    The step's gradient noise and a clip policy's noise come from one `flat_normal`
    (independent entries): a second draw (or a key split) inside the step made XLA:CPU
    serialise the noise behind the gradient (it ran beside it), 0.2 ms a step on a small
    model. The gradient's part comes first, so it is the draw without a policy, bit for bit;
    the policy's normal follows the gradient's padded block.
    """
    if not gradient and not clip:
        return None, None
    size = flat_size(summed) if gradient else 0
    flat = flat_normal(key, summed, extra=1 if clip else 0)
    z = flat[:size] if gradient else None
    return z, (flat[size].astype(jnp.float32) if clip else None)


@runtime_checkable
class ClipPolicy(Protocol):
    """A clip norm that changes during training (e.g. `AdaptiveClip`), passed as ``clip_norm=``.

    ``norm(state)`` is this step's clip norm (a float32 scalar); ``update(state, norms, mask,
    normal, expected_batch_size)`` the next state from the step's pre-clip per-example norms
    and ``normal``, a standard-normal float32 scalar drawn with the step's gradient noise and
    independent of it (the policy's own noise, e.g. for a private count). ``dp_event(k)`` is
    the policy's own release for ``k`` participations of an example (a ``dp_accounting``
    ``DpEvent``; ``None`` when its clip norm releases nothing about the data, e.g. a
    schedule), which the accountant merges with the gradient's.
    """

    def init(self) -> Any:
        """The state before the first step (a pytree of arrays).

        Returns:
            The state.
        """
        ...

    def norm(self, state: Any) -> jax.Array:
        """This step's clip norm.

        Args:
            state: the policy's state.

        Returns:
            A float32 scalar > 0.
        """
        ...

    def update(
        self,
        state: Any,
        norms: jax.Array,
        mask: jax.Array | None,
        normal: jax.Array,
        expected_batch_size: float,
    ) -> Any:
        """The state after a step.

        Args:
            state: the policy's state.
            norms: float32 ``(B,)`` pre-clip per-example norms.
            mask: bool ``(B,)`` real examples, or ``None``.
            normal: a standard-normal float32 scalar, independent of the gradient's noise.
            expected_batch_size: the sampler's expected batch size.

        Returns:
            The new state.
        """
        ...

    def dp_event(self, participations: int) -> Any:
        """The policy's own release for ``participations`` participations of an example.

        Args:
            participations: the participations one accounted release covers.

        Returns:
            A ``dp_accounting.DpEvent``, or ``None`` for a policy that releases nothing.
        """
        ...


def clip_policy(clip_norm: float | ClipPolicy) -> ClipPolicy | None:
    """``clip_norm`` when it is a `ClipPolicy`, ``None`` for a fixed clip norm."""
    return clip_norm if isinstance(clip_norm, ClipPolicy) else None


@dataclasses.dataclass(frozen=True, eq=False)
class DPAccounting:
    """How a DP gradient's privacy is accounted: its ``requirements.privacy``.

    One object per `DPGradientFn`, compared by identity: the programs pass it to the gradient
    in ``context.privacy`` and the gradient refuses a call that carries another (a wrapper
    that does not forward ``requirements``). `make_epoch` calls ``check_sampler``; the
    accountant (`epoch_epsilon`) calls ``dp_event``.

    Attributes:
        noise_multiplier: ``σ`` of the gradient's noise.
        noise: the `NoiseMechanism` (``None``: DP-SGD).
        clip: the clip norm or the `ClipPolicy`.
    """

    noise_multiplier: float
    noise: NoiseMechanism | None
    clip: float | ClipPolicy

    @property
    def min_separation(self) -> int:
        """The separation of participations the accounting assumes (1 for DP-SGD)."""
        return 1 if self.noise is None else int(self.noise.min_separation)

    def check_sampler(self, sampler: Sampler) -> None:
        """`PairingError` unless ``sampler`` separates participations as ``noise`` assumes.

        Args:
            sampler: the epoch's sampler.

        Raises:
            PairingError: e.g. ``BandMF(bands=4)`` with a ``PoissonSampler``.
        """
        check_pairing(self.noise, sampler)

    def dp_event(self, sample_rate: float, steps: int) -> Any:
        """The run's ``dp_accounting`` event: the mechanism's over the merged releases.

        Args:
            sample_rate: the sampler's rate.
            steps: the noisy steps.

        Returns:
            A ``dp_accounting.DpEvent``.

        Raises:
            TypeError: the mechanism or the clip policy has no ``dp_event``.
            ImportError: dp-accounting is not installed.
        """
        from jaxwise.privacy._accounting import run_event

        clip = clip_policy(self.clip)
        return run_event(self.noise_multiplier, sample_rate, steps, self.noise, clip)

    def __repr__(self) -> str:
        return (
            f"DPAccounting(noise_multiplier={self.noise_multiplier}, noise={self.noise!r}, "
            f"clip={self.clip!r})"
        )


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
        accounting = DPAccounting(self.noise_multiplier, self.noise, self.clip_norm)
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
        """A key every step, its `DPAccounting`, and it applies the compute dtype itself."""
        return Requirements(key=True, privacy=self.accounting, precision=True)

    def init(self, params: Any) -> dict[str, Any]:
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
) -> tuple[Any, jax.Array, Any, dict[str, Any], Any]:
    """THE DP gradient: clip, sum, noise once (through ``noise``), divide; the policy's update.

    `DPGradientFn` and the functional `dp_gradient` both run this.

    Returns:
        ``(noisy mean gradient, norms (B,), new model state or None, new state
        {"noise", "clip"}, this step's clip norm)``.
    """
    o = options
    policy = clip_policy(o.clip_norm)
    clip: Any = o.clip_norm if policy is None else policy.norm(state["clip"])
    summed, norms, new_model_state = _clipped(loss, params, model_state, batch, mask, clip, o)
    new_state = dict(state)
    std = o.noise_multiplier * clip if o.noise_multiplier else 0.0
    z, normal = _draw(key, summed, gradient=bool(o.noise_multiplier), clip=policy is not None)
    grads, new_state["noise"] = add_noise(
        summed, z, state["noise"], noise=o.noise, std=std, batch_size=expected_batch_size
    )
    if policy is not None:
        assert normal is not None  # drawn whenever there is a policy
        new_state["clip"] = policy.update(state["clip"], norms, mask, normal, expected_batch_size)
    return grads, norms, new_model_state, new_state, clip


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
    params: Any,
    batch: Any,
    key: jax.Array,
    *,
    clip_norm: float | ClipPolicy,
    noise_multiplier: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    mask: jax.Array | None = None,
    expected_batch_size: float | None = None,
    model_state: Any = NO_MODEL_STATE,
    freeze_model_state: bool = False,
    noise: NoiseMechanism | None = None,
    state: Any = None,
) -> DPGradient:
    """The DP-SGD gradient of one batch: ``DPGradient(noisy mean gradient, norms, model_state)``.

    With ``model_state`` the loss is ``loss(params, model_state, example) -> (loss,
    new_model_state)`` and the result's ``model_state`` is the new model state. State
    computed from the examples (BatchNorm's running statistics, or any leaf of the new state
    that depends on the example) is refused with a ``ValueError`` naming it: per-example
    clipping does not bound one example's influence through it. Per-example-safe state
    (RNG streams, counters) advances once per call; every typed key in it gets the
    example's index folded in for that example's loss (dropout masks differ between
    examples). Models from [`jaxwise.models`][jaxwise.models] refuse BatchNorm in training
    mode inside this call; ``freeze_model_state=True`` runs it in inference mode from the
    statistics in the state instead.

    Args:
        loss: ``loss(params, example) -> scalar`` for ONE example (with ``model_state``:
            ``loss(params, model_state, example) -> (scalar, new_model_state)``).
        params: the parameters, any pytree of float arrays.
        batch: the examples, any pytree (tuple, dict, dataclass) whose leaves share a leading
            example axis ``B``; ``loss`` receives one example, that axis removed.
        key: PRNG key for the noise.
        clip_norm: ``C``, the per-example clipping norm, or a
            [`ClipPolicy`][jaxwise.privacy.ClipPolicy] (its norm read from ``state``).
        noise_multiplier: ``σ``: the noise std is ``σ·C``.
        method: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        chunk_size: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        mask: optional bool ``(B,)``: real examples of a padded Poisson batch.
        expected_batch_size: the denominator; default ``B`` (fixed-size batches). Pass
            ``q·N`` with Poisson batches.
        model_state: the model's non-trainable state (omit it for a loss without one).
        freeze_model_state: run BatchNorm layers of adapted models in inference mode.
        noise: a [`NoiseMechanism`][jaxwise.privacy.NoiseMechanism], or ``None`` for
            independent Gaussian noise (DP-SGD).
        state: ``{"noise": ..., "clip": ...}``, the previous step's ``DPGradient.state``;
            ``None``: the state before the first step (the mechanism's and the policy's
            ``init``).

    Returns:
        A [`DPGradient`][jaxwise.privacy.DPGradient]: ``grads`` like ``params``, the
            ``(B,)`` pre-clip ``norms``, the new ``model_state`` (``None`` without one) and
            the new ``state``. The same computation as
            [`dp_gradient_fn`][jaxwise.privacy.dp_gradient_fn]'s, bit for bit (one
            implementation).

    Raises:
        TypeError: a bad ``loss``, ``params``, ``batch``, ``key``, ``noise`` or
            ``freeze_model_state``.
        ValueError: a bad ``clip_norm``/``noise_multiplier``, batch leaves that do not
            share their leading dimension, or model state (or a layer) that mixes examples.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> loss = lambda w, x: jnp.sum(w * x)
        >>> g, norms, _, _ = dp_gradient(loss, jnp.ones(2), jnp.asarray([[3.0, 4.0], [0.0, 1.0]]),
        ...                           jax.random.key(0), clip_norm=1.0, noise_multiplier=0.0)
        >>> [round(v, 4) for v in g.tolist()], norms.tolist()
        ([0.3, 0.9], [5.0, 1.0])

        With model state, e.g. a step counter:

        >>> def counted(w, count, x):
        ...     return jnp.sum(w * x), count + 1
        >>> g, norms, count, _ = dp_gradient(counted, jnp.ones(2), jnp.ones((3, 2)),
        ...     jax.random.key(0), clip_norm=1.0, noise_multiplier=0.0, model_state=jnp.int32(0))
        >>> int(count)
        1
    """
    options = _dp_options(clip_norm, noise_multiplier, noise, method, chunk_size)
    check_key(key)
    if expected_batch_size is None:
        expected_batch_size = batch_size_of(batch)
    else:
        check_float(
            expected_batch_size,
            "expected_batch_size",
            min_value=0.0,
            min_inclusive=False,
            allow_traced=True,
        )
    options = options._replace(freeze_model_state=freeze_model_state)
    if state is None:
        state = DPGradientFn(loss, options.clip_norm, options.noise_multiplier, noise=noise).init(
            params
        )
    grads, norms, new_model_state, new_state, _ = dp_step(
        loss,
        params,
        model_state,
        batch,
        state,
        key=key,
        mask=mask,
        options=options,
        expected_batch_size=expected_batch_size,
    )
    return DPGradient(grads, norms, new_model_state, new_state)


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

    Each step clips every real example's gradient to norm ``C`` (ghost clipping wherever the
    loss allows it, see [`clip_and_sum`][jaxwise.per_example.clip_and_sum]), sums, adds
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

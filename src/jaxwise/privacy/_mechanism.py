"""DP-SGD as a gradient function: clipping policies and noise mechanisms plug into it.

`dp_gradient_fn` returns a `DPGradientFn`, a `jaxwise.train.StatefulGradientFn`: each step
clips every example's gradient to norm ``C``, sums, adds ``noise_multiplier · C · noise`` and
divides by the sampler's expected batch size. ``noise`` comes from a `NoiseMechanism`
(``None``: independent Gaussian noise, DP-SGD) that turns this step's standard-normal draw
``z`` into the noise (correlated across steps for matrix-factorization mechanisms); ``C``
from a float or a `ClipPolicy` (adaptive clipping). Its state, ``{"noise": mechanism state,
"clip": policy state}`` (``()`` for an absent part), lives in ``TrainState.gradient_state``.

A mechanism states the participation its accounting assumes (``min_separation``: an example
joins at most once in that many steps) and a `SeparatedSampler` the separation it guarantees;
`make_epoch` refuses a pairing where the sampler guarantees less with a `PairingError`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from jaxwise._checks import check_bool, check_callable
from jaxwise._errors import JaxwiseError
from jaxwise._losses import (
    ChunkSize,
    Method,
    check_chunk,
    check_clip_norm,
    check_method,
)
from jaxwise.privacy._noise import (
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
from jaxwise.train import Gradients, Sampler

__all__ = [
    "ClipPolicy",
    "DPGradientFn",
    "NoiseMechanism",
    "PairingError",
    "SeparatedSampler",
    "add_noise",
    "check_pairing",
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
    (`PairingError`).
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
        raise PairingError(
            f"`noise` {noise} needs every example to join at most once every {need} steps "
            f"(its privacy accounting assumes it), but `sampler` {type(sampler).__name__} "
            f"guarantees {have}: train it with privacy.CyclicPoissonSampler(batch_size, "
            f"groups={need}) (or more groups)"
        )


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
    independent of it (the policy's own noise, e.g. for a private count).
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


@runtime_checkable
class _BatchSized(Protocol):
    """A sampler whose expected batch is not ``sample_rate(n) · n`` (one group a step)."""

    def expected_batch_size(self, n: int) -> float: ...


@dataclasses.dataclass(frozen=True)
class DPGradientFn:
    """The DP-SGD gradient function (a `StatefulGradientFn`); made by `dp_gradient_fn`.

    Attributes:
        loss: the per-example loss.
        clip_norm: ``C`` (a float) or a `ClipPolicy`.
        noise_multiplier: ``σ``: the noise std is ``σ·C``.
        method: the per-example clipping method.
        chunk_size: the chunk size of the ``"vmap"``/``"chunked"`` methods.
        model_state: the loss takes and returns the model state.
        freeze_model_state: BatchNorm layers of adapted models run in inference mode.
        noise: a `NoiseMechanism`, or ``None`` for independent Gaussian noise.
        expected_batch_size: the denominator (set from the epoch's sampler; ``None``: the
            batch's rows).
    """

    loss: Callable[..., Any]
    clip_norm: float | ClipPolicy
    noise_multiplier: float
    method: Method = "auto"
    chunk_size: ChunkSize = None
    model_state: bool = False
    freeze_model_state: bool = False
    noise: NoiseMechanism | None = None
    expected_batch_size: float | None = None

    def init(self, params: Any) -> dict[str, Any]:
        """``{"noise": mechanism state, "clip": policy state}`` (``()`` for an absent part).

        Args:
            params: the parameters.

        Returns:
            The state before the first step.
        """
        noise = () if self.noise is None else self.noise.init(flat_zeros(params))
        clip = self.clip_norm.init() if isinstance(self.clip_norm, ClipPolicy) else ()
        return {"noise": noise, "clip": clip}

    def for_sampler(self, sampler: Sampler, n: int) -> DPGradientFn:
        """This gradient dividing by ``sampler``'s expected batch size over ``n`` examples.

        Args:
            sampler: the epoch's sampler.
            n: the number of examples.

        Returns:
            A copy with ``expected_batch_size`` the sampler's ``expected_batch_size(n)``
                where it has one (a `CyclicPoissonSampler`: its group's rate times the
                group's size), else ``sampler.sample_rate(n) * n``.
        """
        if isinstance(sampler, _BatchSized):
            return dataclasses.replace(self, expected_batch_size=sampler.expected_batch_size(n))
        return dataclasses.replace(self, expected_batch_size=sampler.sample_rate(n) * n)

    def check_sampler(self, sampler: Sampler) -> None:
        """`PairingError` unless ``sampler`` separates participations as ``noise`` assumes.

        Args:
            sampler: the epoch's sampler.

        Raises:
            PairingError: e.g. ``BandMF(bands=4)`` with a ``PoissonSampler`` (use
                ``CyclicPoissonSampler(batch_size, groups>=4)``).
        """
        check_pairing(self.noise, sampler)

    def __call__(
        self,
        params: Any,
        model_state: Any,
        batch: Any,
        *,
        key: jax.Array | None,
        mask: jax.Array | None,
        state: Any,
    ) -> Gradients:
        """One batch's DP gradient, its clipping metrics and the new state.

        Args:
            params: the parameters.
            model_state: the model state (used with ``model_state=True``).
            batch: the examples (leading axis ``B``).
            key: this step's key (one normal draw: the noise and a `ClipPolicy`'s own).
            mask: bool ``(B,)`` real examples, or ``None``.
            state: ``{"noise": ..., "clip": ...}``.

        Returns:
            `Gradients` without a loss; metrics ``grad_norm_mean``, ``clipped_fraction``,
            ``batch_size``.
        """
        if key is None:
            raise ValueError("the DP gradient needs a `key` for its noise")
        policy = self.clip_norm if isinstance(self.clip_norm, ClipPolicy) else None
        clip: Any = self.clip_norm if policy is None else policy.norm(state["clip"])
        summed, norms, new_model_state = self._clipped(params, model_state, batch, mask, clip)
        denominator = (
            norms.shape[0] if self.expected_batch_size is None else self.expected_batch_size
        )
        new_state = dict(state)
        std = self.noise_multiplier * clip if self.noise_multiplier else 0.0
        z, normal = _draw(key, summed, gradient=bool(self.noise_multiplier), clip=bool(policy))
        grads, new_state["noise"] = add_noise(
            summed, z, state["noise"], noise=self.noise, std=std, batch_size=denominator
        )
        if policy is not None:
            assert normal is not None  # drawn whenever there is a policy
            new_state["clip"] = policy.update(state["clip"], norms, mask, normal, denominator)
        real = jnp.ones(norms.shape, jnp.float32) if mask is None else mask.astype(jnp.float32)
        count = jnp.maximum(real.sum(), 1.0)
        metrics = {
            "grad_norm_mean": jnp.sum(norms * real) / count,
            "clipped_fraction": jnp.sum((norms > clip).astype(jnp.float32) * real) / count,
            "batch_size": jnp.sum(real).astype(jnp.int32),
        }
        if policy is not None:
            metrics["clip_norm"] = jnp.asarray(clip, jnp.float32)
        kept = new_model_state if self.model_state else model_state
        return Gradients(grads, None, kept, None, metrics, new_state)

    def _clipped(
        self, params: Any, model_state: Any, batch: Any, mask: Any, clip: Any
    ) -> tuple[Any, jax.Array, Any]:
        """The clipped sum at ``clip`` (a traced norm: clip ``loss / C`` at 1, rescale)."""
        state = model_state if self.model_state else NO_MODEL_STATE
        options: dict[str, Any] = dict(
            method=self.method,
            chunk_size=self.chunk_size,
            mask=mask,
            model_state=state,
            freeze_model_state=self.freeze_model_state,
        )
        if isinstance(clip, float):
            return clipped_sum(self.loss, params, batch, clip_norm=clip, **options)
        loss = self.loss

        def scaled(*args: Any) -> Any:
            out = loss(*args)
            if self.model_state:
                return out[0] / clip, out[1]
            return out / clip

        summed, norms, new_state = clipped_sum(scaled, params, batch, clip_norm=1.0, **options)
        return jax.tree.map(lambda g: g * clip.astype(g.dtype), summed), norms * clip, new_state


def dp_gradient_fn(
    loss: Callable[..., Any],
    *,
    clip_norm: float | ClipPolicy,
    noise_multiplier: float,
    method: Method = "auto",
    chunk_size: ChunkSize = None,
    model_state: bool = False,
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
        loss: ``loss(params, example) -> scalar`` for ONE example; with ``model_state=True``
            ``loss(params, model_state, example) -> (scalar, new_model_state)``.
        clip_norm: ``C > 0``, or a [`ClipPolicy`][jaxwise.privacy.ClipPolicy].
        noise_multiplier: ``σ >= 0``.
        method: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        chunk_size: as in [`clip_and_sum`][jaxwise.per_example.clip_and_sum].
        model_state: the loss takes and returns the model state.
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
    check_noise(noise_multiplier)
    if not isinstance(clip_norm, ClipPolicy):
        check_clip_norm(clip_norm)
        check_noise_scale(clip_norm, noise_multiplier)
        clip_norm = float(clip_norm)
    check_method(method)
    check_chunk(chunk_size)
    check_bool(model_state, "model_state")
    check_bool(freeze_model_state, "freeze_model_state")
    if noise is not None and not isinstance(noise, NoiseMechanism):
        raise TypeError(
            "`noise` must be None or a jaxwise.privacy.NoiseMechanism (init, correlate), got "
            f"{type(noise).__name__}"
        )
    return DPGradientFn(
        loss, clip_norm, float(noise_multiplier), method, chunk_size, model_state,
        freeze_model_state, noise,
    )  # fmt: skip

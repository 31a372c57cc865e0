"""The DP gradient divided by its step's clip norm: a learning rate that does not move with C."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jaxwise.privacy._clipping._dpgradient import DPGradientFn
from jaxwise.privacy._mechanisms._protocols import ClipPolicy, NoiseMechanism, clip_policy
from jaxwise.train import Gradients, Requirements, StepContext

__all__ = ["UnitClipped", "unit_clip"]


@dataclasses.dataclass(frozen=True)
class UnitClipped:
    """A `DPGradientFn` whose released gradient is divided by the step's clip norm ``C``.

    Made by `unit_clip`; a `jaxwise.train.GradientFn` that forwards the protocol: the wrapped
    gradient's state, its ``requirements`` (so its sampler rules and its accounting: dividing
    by ``C`` is post-processing) and its metrics.

    Attributes:
        gradient: the wrapped `DPGradientFn`.
    """

    gradient: DPGradientFn

    @property
    def requirements(self) -> Requirements:
        """The wrapped gradient's (its privacy is accounted unchanged)."""
        return self.gradient.requirements

    @property
    def loss(self) -> Callable[..., Any]:
        """The wrapped gradient's loss (it names the program)."""
        return self.gradient.loss

    @property
    def clip_norm(self) -> float | ClipPolicy:
        """The wrapped gradient's ``clip_norm`` (a float or a `ClipPolicy`)."""
        return self.gradient.clip_norm

    @property
    def noise_multiplier(self) -> float:
        """The wrapped gradient's ``σ``."""
        return self.gradient.noise_multiplier

    @property
    def noise(self) -> NoiseMechanism | None:
        """The wrapped gradient's noise mechanism (``None``: DP-SGD)."""
        return self.gradient.noise

    def init(self, params: Any) -> Any:
        """The wrapped gradient's state before the first step.

        Args:
            params: the parameters.

        Returns:
            ``{"noise": ..., "clip": ...}`` as `DPGradientFn.init`.
        """
        return self.gradient.init(params)

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
        """The wrapped gradient's step with its gradient divided by this step's ``C``.

        Args:
            params: the parameters.
            model_state: the model state.
            batch: the examples (leading axis ``B``).
            state: ``{"noise": ..., "clip": ...}``.
            key: this step's key.
            mask: bool ``(B,)`` real examples, or ``None``.
            context: the step's facts (forwarded).

        Returns:
            The wrapped `Gradients` with ``grads / C`` (``C`` the clip norm the step clipped
                at, before a policy's update).
        """
        policy = clip_policy(self.gradient.clip_norm)
        clip: Any = self.gradient.clip_norm if policy is None else policy.norm(state["clip"])
        out = self.gradient(params, model_state, batch, state, key=key, mask=mask, context=context)
        grads = jax.tree.map(lambda g: g / jnp.asarray(clip, g.dtype), out.grads)
        return out._replace(grads=grads)


def unit_clip(gradient: DPGradientFn) -> UnitClipped:
    """The DP gradient divided by the step's clip norm (De et al. 2022's unit-norm rescale).

    The released gradient ``(Σ clip_C(g_i) + σ·C·z) / B`` scales with ``C``, so the step size
    moves with the clip norm: an adaptive clip norm (`AdaptiveClip`) that grows makes larger
    steps, larger noise and larger gradient norms, and can run away. Dividing by ``C`` gives
    ``(Σ clip_1(g_i/C)·… + σ·z) / B``: every example contributes at most ``1/B`` whatever
    ``C`` is, and the learning rate now means the step for a unit-norm (fully clipped)
    gradient, not for norm ``C`` — with a fixed clip norm ``C`` the same training is the
    un-normalised one at learning rate ``lr / C`` (for SGD). Dividing a released value by a
    value known to the releaser (``C`` is fixed, or itself a private release of the adaptive
    clip) is post-processing: ε is unchanged, and `epsilon`/`epoch_epsilon` account the
    wrapped gradient exactly as before. Works with a fixed or adaptive clip, every clipping
    method, any sampler the wrapped gradient accepts and any `NoiseMechanism`.

    Args:
        gradient: a [`DPGradientFn`][jaxwise.privacy.DPGradientFn] (from `dp_gradient_fn`).

    Returns:
        A [`UnitClipped`][jaxwise.privacy.UnitClipped] gradient function.

    Raises:
        TypeError: ``gradient`` is not a `DPGradientFn` (e.g. already unit-clipped).

    References:
        De et al., Unlocking High-Accuracy Differentially Private Image Classification through
        Scale, 2022, https://arxiv.org/abs/2204.13650 (jax-privacy's ``rescale_to_unit_norm``).

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise.privacy import dp_gradient_fn
        >>> def sq(w, example): return (jnp.dot(w, example["x"]) - example["y"]) ** 2
        >>> from jaxwise.train import StepContext
        >>> gradient = unit_clip(dp_gradient_fn(sq, clip_norm=4.0, noise_multiplier=0.0))
        >>> batch = {"x": jnp.ones((2, 3)), "y": jnp.zeros(2)}
        >>> context = StepContext(2.0, privacy=gradient.requirements.privacy)
        >>> out = gradient(jnp.ones(3), None, batch, gradient.init(jnp.ones(3)),
        ...                key=jax.random.key(0), mask=None, context=context)
        >>> [round(float(g), 3) for g in out.grads]  # each clipped to norm 4, mean, / 4: 1/√3
        [0.577, 0.577, 0.577]
    """
    if not isinstance(gradient, DPGradientFn):
        raise TypeError(
            "`gradient` must be a privacy.DPGradientFn (from privacy.dp_gradient_fn), got "
            f"{type(gradient).__name__}"
        )
    return UnitClipped(gradient)

"""Adaptive clipping: the clip norm follows a private quantile of the gradient norms."""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from jaxwise._shared._checks import check_float
from jaxwise._typing import ClipState

if TYPE_CHECKING:  # dp-accounting is the `privacy` extra
    from dp_accounting import DpEvent

__all__ = ["AdaptiveClip"]


@dataclasses.dataclass(frozen=True)
class AdaptiveClip:
    """A clip policy (``dp_gradient_fn(clip_norm=AdaptiveClip(...))``) after Andrew et al. 2021.

    Each step sums ``1/2`` for every real example whose gradient norm is at most the current
    clip norm ``C`` and ``−1/2`` for the others (sensitivity 1/2), adds Gaussian noise of std
    ``count_noise``, divides by the expected batch size and adds ``1/2``: ``b̃ ≈`` the
    fraction unclipped, clipped to ``[0, 1]``. The clip norm then moves geometrically towards the
    ``target_quantile`` of the norms: ``C ← C · exp(−learning_rate · (b̃ − target_quantile))``.
    The count is a second release each step; together with the gradient's noise multiplier
    ``σ`` it is one Gaussian mechanism of multiplier ``(σ⁻² + (2·count_noise)⁻²)^{−1/2}``,
    which `epsilon`/`noise_multiplier_for` use when given ``clip=``. Andrew et al. suggest
    ``count_noise ≈ expected batch size / 20``.

    Attributes:
        initial: the first clip norm, > 0.
        target_quantile: the quantile of the norms to track, in (0, 1).
        learning_rate: the geometric step size, > 0.
        count_noise: the std of the count's noise (in examples), > 0.

    Raises:
        TypeError: a non-float field.
        ValueError: a field out of range.

    References:
        Andrew et al., Differentially Private Learning with Adaptive Clipping, NeurIPS 2021,
        https://arxiv.org/abs/1905.03871

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> policy = AdaptiveClip(initial=1.0, count_noise=0.5)
        >>> state = policy.init()
        >>> norms = jnp.full(64, 10.0)  # every example clipped: the clip norm grows
        >>> state = policy.update(state, norms, None, jax.random.normal(jax.random.key(0)), 64.0)
        >>> bool(policy.norm(state) > 1.0)
        True
    """

    initial: float
    target_quantile: float = 0.5
    learning_rate: float = 0.2
    count_noise: float = 10.0

    def __post_init__(self) -> None:
        check_float(self.initial, "initial", min_value=0.0, min_inclusive=False)
        if not math.isfinite(float(self.initial)):
            raise ValueError(f"`initial` must be finite, got {self.initial}")
        check_float(
            self.target_quantile,
            "target_quantile",
            min_value=0.0,
            max_value=1.0,
            min_inclusive=False,
            max_inclusive=False,
        )
        check_float(self.learning_rate, "learning_rate", min_value=0.0, min_inclusive=False)
        check_float(self.count_noise, "count_noise", min_value=0.0, min_inclusive=False)

    def init(self) -> dict[str, jax.Array]:
        """The state: ``{"clip_norm": float32 scalar}``, starting at ``initial``.

        Returns:
            The state.
        """
        return {"clip_norm": jnp.asarray(self.initial, jnp.float32)}

    def norm(self, state: ClipState) -> jax.Array:
        """The clip norm of this step (float32 scalar).

        Args:
            state: the policy's state.

        Returns:
            The clip norm.
        """
        return state["clip_norm"]

    def update(
        self,
        state: ClipState,
        norms: jax.Array,
        mask: jax.Array | None,
        normal: jax.Array,
        expected_batch_size: float | jax.Array,
    ) -> dict[str, jax.Array]:
        """The state after one step: the geometric update from the noised unclipped count.

        Args:
            state: the policy's state.
            norms: ``(B,)`` the examples' gradient norms (before clipping).
            mask: ``(B,)`` bool of the real rows, or ``None`` (all real).
            normal: a standard-normal scalar for the count's noise (independent of the
                gradient noise; `dp_gradient_fn` draws both at once).
            expected_batch_size: the divisor of the count.

        Returns:
            The new state.
        """
        clip = state["clip_norm"]
        # centred at 0 (±1/2 an example): adding or removing one changes the sum by 1/2,
        # the sensitivity `effective_noise_multiplier` accounts (as TF Privacy's query)
        below = (norms <= clip).astype(jnp.float32) - 0.5
        if mask is not None:
            below = below * mask.astype(jnp.float32)
        noisy = jnp.sum(below) + self.count_noise * jnp.asarray(normal, jnp.float32)
        fraction = noisy / jnp.asarray(expected_batch_size, jnp.float32) + 0.5
        fraction = jnp.clip(fraction, 0.0, 1.0)
        step = jnp.exp(-self.learning_rate * (fraction - self.target_quantile))
        return {"clip_norm": (clip * step).astype(jnp.float32)}

    def dp_event(self, participations: int) -> DpEvent:
        """The count's own release: ``participations`` Gaussians of multiplier ``2·count_noise``
        (sensitivity 1/2), as one ``dp_accounting.GaussianDpEvent``.

        Args:
            participations: the count releases one accounted release covers (1 for DP-SGD
                and amplified BandMF; BLT's ``ceil(steps / min_sep)``).

        Returns:
            ``GaussianDpEvent(2·count_noise / √participations)``.
        """
        from jaxwise._shared._extras import require

        dp_accounting = require("dp_accounting", extra="privacy", feature="AdaptiveClip.dp_event")
        return dp_accounting.GaussianDpEvent(2 * self.count_noise / math.sqrt(participations))

    def effective_noise_multiplier(self, noise_multiplier: float, participations: int = 1) -> float:
        """The one Gaussian multiplier equivalent to the gradient's and the count's noise.

        Args:
            noise_multiplier: the gradient's σ.
            participations: the count releases one example is in per accounted release
                (1 for DP-SGD and amplified BandMF; BLT's ``ceil(steps / min_sep)``).

        Returns:
            ``(σ⁻² + participations · (2·count_noise)⁻²)^{−1/2}`` (0 when σ = 0).
        """
        if noise_multiplier == 0:
            return 0.0
        return (noise_multiplier**-2 + participations * (2 * self.count_noise) ** -2) ** -0.5

    def gradient_noise_multiplier(self, effective: float, participations: int = 1) -> float:
        """The gradient's σ whose `effective_noise_multiplier` is ``effective``.

        Args:
            effective: the target effective multiplier.
            participations: as in `effective_noise_multiplier`.

        Returns:
            The gradient's σ.

        Raises:
            ValueError: the count's noise alone is below the target (raise ``count_noise``).
        """
        rest = effective**-2 - participations * (2 * self.count_noise) ** -2
        if rest <= 0:
            raise ValueError(
                f"`count_noise` {self.count_noise} is too small for an effective noise "
                f"multiplier of {effective:.4g}: it needs count_noise > "
                f"{effective * math.sqrt(participations) / 2:.4g}"
            )
        return rest**-0.5

"""(ε, δ) from dp-accounting's RDP or PLD accountant, and the σ for a target ε.

dp-accounting is an optional dependency (``pip install 'jaxwise[privacy]'``), imported when
an accountant is first needed.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np

from jaxwise._checks import check_choice, check_float, check_int, check_probability
from jaxwise._extras import require
from jaxwise.privacy._adaptive import AdaptiveClip
from jaxwise.privacy._bandmf import BandMF
from jaxwise.privacy._blt import BLT
from jaxwise.privacy._mechanism import DPGradientFn, check_pairing
from jaxwise.privacy._noise import check_noise
from jaxwise.privacy._unit import UnitClipped
from jaxwise.train import TrainEpoch

__all__ = ["epoch_epsilon", "epsilon", "noise_multiplier_for"]

Accountant = Literal["rdp", "pld"]
ACCOUNTANTS = ("rdp", "pld")
Mechanism = BandMF | BLT | None


def _check_mechanism(mechanism: Any, clip: Any, steps: int) -> None:
    if mechanism is not None and not isinstance(mechanism, (BandMF, BLT)):
        raise TypeError(
            f"`mechanism` must be None (DP-SGD), a BandMF or a BLT, got {type(mechanism).__name__}"
        )
    if clip is not None and not isinstance(clip, AdaptiveClip):
        raise TypeError(f"`clip` must be None or an AdaptiveClip, got {type(clip).__name__}")
    if isinstance(mechanism, BLT) and steps > mechanism.steps:
        raise ValueError(
            f"`steps` {steps} exceeds the {mechanism.steps} steps the BLT strategy was built "
            "for: its sensitivity only covers those"
        )


def _participations(mechanism: Mechanism, steps: int) -> int:
    """Count releases per accounted release: BLT's participations, else 1."""
    if isinstance(mechanism, BLT):
        return -(-int(steps) // mechanism.min_separation)
    return 1


def _effective(noise_multiplier: float, mechanism: Mechanism, clip: Any, steps: int) -> float:
    if clip is None:
        return noise_multiplier
    return clip.effective_noise_multiplier(noise_multiplier, _participations(mechanism, steps))


def _dp_accounting(feature: str) -> Any:
    return require("dp_accounting", extra="privacy", feature=feature)


def _check_accounting(
    sample_rate: float, steps: int | np.integer, delta: float, accountant: str
) -> None:
    check_probability(sample_rate, "sample_rate", open_low=True)
    check_int(steps, "steps", min_value=1)
    check_probability(delta, "delta", open_low=True, open_high=True)
    check_choice(accountant, "accountant", ACCOUNTANTS)


def _accountant(dp_accounting: Any, kind: str) -> Any:
    if kind == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    return dp_accounting.pld.PLDAccountant()


def _event(
    dp_accounting: Any,
    noise_multiplier: float,
    sample_rate: float,
    steps: int | np.integer,
    mechanism: Mechanism = None,
) -> Any:
    """DP-SGD's event; amplified BandMF's over ``ceil(steps / bands)``; BLT's one Gaussian."""
    if isinstance(mechanism, BLT):
        return dp_accounting.GaussianDpEvent(noise_multiplier)
    compositions = int(steps)
    if isinstance(mechanism, BandMF):  # one example's participations: every min_separation steps
        compositions = -(-compositions // mechanism.min_separation)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        compositions,
    )


@contextlib.contextmanager
def _quiet_absl() -> Iterator[None]:
    """Hide absl's WARNING lines (dp-accounting's "failed to converge … excluding this order")."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _epsilon(
    dp_accounting: Any,
    noise_multiplier: float,
    sample_rate: float,
    steps: int | np.integer,
    delta: float,
    accountant: str,
    mechanism: Mechanism = None,
) -> float:
    if noise_multiplier == 0:
        return float("inf")
    acc = _accountant(dp_accounting, accountant)
    with _quiet_absl():  # dp-accounting logs orders it excludes; the result already says all
        acc.compose(_event(dp_accounting, noise_multiplier, sample_rate, steps, mechanism))
        return float(acc.get_epsilon(delta))


def epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int | np.integer,
    delta: float,
    accountant: Accountant = "rdp",
    mechanism: Mechanism = None,
    clip: AdaptiveClip | None = None,
) -> float:
    """ε of DP-SGD with Poisson sampling, from dp-accounting (RDP by default, ``"pld"`` optional).

    Composes dp-accounting's ``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` over ``steps``.
    With ``mechanism=BandMF(bands=b, ...)`` (trained with a
    [`CyclicPoissonSampler`][jaxwise.privacy.CyclicPoissonSampler] of ``groups >= b``) the
    same event over ``ceil(steps / b)`` compositions, ``q`` the rate of a step's group
    (``sampler.sample_rate(n) = B / (n // groups)``): amplified BandMF (Choquette-Choo et
    al. 2023). With ``mechanism=BLT(...)``: one ``GaussianDpEvent(σ)`` (BLT's noise is scaled
    to sensitivity 1 under its participation; no amplification, as jax-privacy's
    ``SingleReleaseTrainingAccountant``). With ``clip=AdaptiveClip(...)`` the count's noise
    is included (σ becomes the policy's ``effective_noise_multiplier``).
    Nothing is printed (dp-accounting's absl warnings about excluded RDP orders are hidden).

    Args:
        noise_multiplier: σ (noise std / clip norm); 0 gives ε = inf.
        sample_rate: q = expected batch size / dataset size, in (0, 1].
        steps: number of noisy gradient steps.
        delta: δ in (0, 1), typically < 1 / dataset size.
        accountant: ``"rdp"`` or ``"pld"``.
        mechanism: ``None`` (DP-SGD), a [`BandMF`][jaxwise.privacy.BandMF] or a
            [`BLT`][jaxwise.privacy.BLT].
        clip: the [`AdaptiveClip`][jaxwise.privacy.AdaptiveClip] policy of the run, if any.

    Returns:
        ε as a float (``inf`` without noise).

    Raises:
        TypeError: an argument of the wrong type (``mechanism``, ``clip`` named).
        ValueError: an argument out of range, an unknown ``accountant``, or more ``steps``
            than a BLT was built for.
        ImportError: dp-accounting is not installed (``pip install 'jaxwise[privacy]'``).

    Examples:
        >>> a = epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=1e-5)
        >>> b = epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=1000, delta=1e-5)
        >>> a < b
        True
    """
    check_noise(noise_multiplier)
    _check_accounting(sample_rate, steps, delta, accountant)
    _check_mechanism(mechanism, clip, int(steps))
    dp_accounting = _dp_accounting("jaxwise.privacy.epsilon")
    sigma = _effective(float(noise_multiplier), mechanism, clip, int(steps))
    return _epsilon(dp_accounting, sigma, sample_rate, steps, delta, accountant, mechanism)


def noise_multiplier_for(
    *,
    epsilon: float,
    sample_rate: float,
    steps: int | np.integer,
    delta: float,
    accountant: Accountant = "rdp",
    mechanism: Mechanism = None,
    clip: AdaptiveClip | None = None,
) -> float:
    """The smallest σ whose ε (Poisson-sampled Gaussian, ``steps`` steps) is ``<= epsilon``.

    Uses ``dp_accounting.calibrate_dp_mechanism`` (bisection to a tolerance of 1e-4).
    ``mechanism`` and ``clip`` as in [`epsilon`][jaxwise.privacy.epsilon] (with ``clip``,
    the gradient's σ, the count's noise accounted). Nothing is printed.

    Args:
        epsilon: the target ε > 0.
        sample_rate: q = expected batch size / dataset size, in (0, 1].
        steps: number of noisy gradient steps.
        delta: δ in (0, 1).
        accountant: ``"rdp"`` or ``"pld"``.
        mechanism: ``None`` (DP-SGD), a [`BandMF`][jaxwise.privacy.BandMF] or a
            [`BLT`][jaxwise.privacy.BLT].
        clip: the [`AdaptiveClip`][jaxwise.privacy.AdaptiveClip] policy of the run, if any.

    Returns:
        The noise multiplier σ.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range, a target unreachable with σ ≤ 1e4, or an
            adaptive clip whose count noise alone is below the needed σ.
        ImportError: dp-accounting is not installed (``pip install 'jaxwise[privacy]'``).

    Examples:
        >>> s = noise_multiplier_for(epsilon=3.0, sample_rate=256 / 60000, steps=10000, delta=1e-5)
        >>> e = epsilon(noise_multiplier=s, sample_rate=256 / 60000, steps=10000, delta=1e-5)
        >>> round(e, 2) <= 3.0
        True
    """
    target = epsilon
    check_float(target, "epsilon", min_value=0.0, min_inclusive=False)
    _check_accounting(sample_rate, steps, delta, accountant)
    _check_mechanism(mechanism, clip, int(steps))
    dp_accounting = _dp_accounting("jaxwise.privacy.noise_multiplier_for")
    sigma = _calibrate(dp_accounting, target, sample_rate, int(steps), delta, accountant, mechanism)
    if clip is None:
        return sigma
    return float(clip.gradient_noise_multiplier(sigma, _participations(mechanism, int(steps))))


def _calibrate(
    dp_accounting: Any,
    target: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str,
    mechanism: Mechanism,
) -> float:
    upper = 1e4
    if _epsilon(dp_accounting, upper, sample_rate, steps, delta, accountant, mechanism) > target:
        raise ValueError(
            f"`epsilon` {target} is unreachable: even noise_multiplier={upper:g} gives more "
            f"(sample_rate={sample_rate}, steps={steps}, delta={delta})"
        )
    with _quiet_absl():  # the bisection composes many accountants; each may log excluded orders
        sigma = dp_accounting.calibrate_dp_mechanism(
            lambda: _accountant(dp_accounting, accountant),
            lambda s: _event(dp_accounting, s, sample_rate, steps, mechanism),
            target,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(1e-3, upper),
            tol=1e-4,
        )
    return float(sigma)


def epoch_epsilon(
    epoch: TrainEpoch,
    n: int,
    *,
    steps: int | np.integer,
    delta: float,
    accountant: Accountant = "rdp",
) -> float:
    """ε of ``steps`` steps of a DP epoch, every number read from the epoch's own objects.

    The noise multiplier, the mechanism and the clip policy come from ``epoch.gradient`` (a
    [`dp_gradient_fn`][jaxwise.privacy.dp_gradient_fn], or the one inside a
    [`unit_clip`][jaxwise.privacy.unit_clip]), the sample rate from
    ``epoch.sampler.sample_rate(n)``; the pairing is checked again (a mechanism whose
    ``min_separation`` the sampler does not guarantee raises `PairingError`), then
    [`epsilon`][jaxwise.privacy.epsilon] accounts it.

    Args:
        epoch: a [`TrainEpoch`][jaxwise.train.TrainEpoch] of a DP gradient.
        n: the dataset size the epoch runs over.
        steps: the noisy steps taken (e.g. ``epochs * epoch.steps_per_epoch(n)``).
        delta: δ in (0, 1).
        accountant: ``"rdp"`` or ``"pld"``.

    Returns:
        ε as a float (``inf`` without noise).

    Raises:
        TypeError: ``epoch`` is not a DP epoch, or its clip policy is not an `AdaptiveClip`.
        PairingError: the epoch's sampler does not separate participations as its
            mechanism assumes.
        ValueError: an argument out of range.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jaxwise.privacy import CyclicPoissonSampler, BandMF, dp_gradient_fn
        >>> from jaxwise.train import make_epoch
        >>> gradient = dp_gradient_fn(lambda w, x: jnp.sum(w * x), clip_norm=1.0,
        ...     noise_multiplier=1.0, noise=BandMF(bands=4, steps=100))
        >>> epoch = make_epoch(gradient, CyclicPoissonSampler(10, groups=4))
        >>> eps = epoch_epsilon(epoch, 1000, steps=100, delta=1e-5)
        >>> eps == epsilon(noise_multiplier=1.0, sample_rate=10 / 250, steps=100, delta=1e-5,
        ...                mechanism=BandMF(bands=4, steps=100))
        True
    """
    if not isinstance(epoch, TrainEpoch) or not isinstance(
        epoch.gradient, (DPGradientFn, UnitClipped)
    ):
        raise TypeError(
            "`epoch` must be a TrainEpoch of a privacy.dp_gradient_fn gradient, got "
            f"{type(epoch).__name__}"
        )
    # unit_clip's division by C is post-processing: the wrapped gradient's accounting
    gradient = (
        epoch.gradient if isinstance(epoch.gradient, DPGradientFn) else epoch.gradient.gradient
    )
    check_pairing(gradient.noise, epoch.sampler)
    n = check_int(n, "n", min_value=1)
    clip: Any = None if isinstance(gradient.clip_norm, float) else gradient.clip_norm
    mechanism: Any = gradient.noise
    return epsilon(
        noise_multiplier=gradient.noise_multiplier,
        sample_rate=epoch.sampler.sample_rate(n),
        steps=steps,
        delta=delta,
        accountant=accountant,
        mechanism=mechanism,
        clip=clip,  # another ClipPolicy than AdaptiveClip: a TypeError naming `clip`
    )

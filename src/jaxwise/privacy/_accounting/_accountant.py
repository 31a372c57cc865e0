"""(ε, δ) from dp-accounting's RDP or PLD accountant, and the σ for a target ε.

dp-accounting is an optional dependency (``pip install 'jaxwise[privacy]'``), imported when
an accountant is first needed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Iterator
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_choice, check_float, check_int, check_probability
from jaxwise._shared._extras import require
from jaxwise.privacy._mechanisms._noise import check_noise
from jaxwise.privacy._mechanisms._protocols import (
    ClipPolicy,
    DPAccounting,
    NoiseMechanism,
    PairingError,
    _check_mechanism,
    check_dp_events,
    clip_policy,
    issued,
)
from jaxwise.train import SamplingFacts, TrainEpoch

__all__ = [
    "PrivacyPlan",
    "privacy_plan",
    "epoch_epsilon",
    "epsilon",
    "noise_multiplier_for",
    "plan_epsilon",
    "run_event",
]

Accountant = Literal["rdp", "pld"]
ACCOUNTANTS = ("rdp", "pld")


def noise_gain(mechanism: NoiseMechanism | None) -> float:
    """The first step's noise per unit draw: ``|correlate(init(0), z)| / |z|`` (DP-SGD: 1).

    Measured on a fixed standard-normal draw of 64 entries: the factor by which the
    mechanism scales the first step's Gaussian (``BandMF``: ``‖c‖ / c₀`` ≥ 1).
    """
    if mechanism is None:
        return 1.0
    z = jax.random.normal(jax.random.key(0), (64,), jnp.float32)
    noise, _ = mechanism.correlate(mechanism.init(jnp.zeros((64,), jnp.float32)), z)
    flat = jnp.concatenate([jnp.ravel(leaf) for leaf in jax.tree.leaves(noise)])
    return float(jnp.linalg.norm(flat) / jnp.linalg.norm(z))


def _check_floor(
    event: Any,
    sigma: float,
    sample_rate: float,
    mechanism: NoiseMechanism | None,
    delta: float,
    accountant: str,
    who: str,
) -> float:
    """ε of ``event``, refused by name when it is below what the program's noise supports.

    The floor: ONE Poisson-sampled Gaussian release at the first step's noise (σ times the
    mechanism's `noise_gain`): every DP run releases at least that step, so an accounting
    that reports less (a ``dp_event`` of ``NoOpDpEvent()``, a claim of more noise than is
    added) under-reports the privacy loss.
    """
    dp_accounting = _dp_accounting("jaxwise.privacy accounting")
    eps = _epsilon(event, delta, accountant)
    gain = noise_gain(mechanism)
    floor_event = dp_accounting.PoissonSampledDpEvent(
        sample_rate, dp_accounting.GaussianDpEvent(sigma * gain)
    )
    floor = _epsilon(floor_event, delta, accountant)
    if eps < floor * (1 - 1e-9) - 1e-12:
        raise ValueError(
            f"{who} accounts ε = {eps:.4g}, less than the ε = {floor:.4g} of the first noisy "
            f"step alone (one Poisson-sampled Gaussian release at noise multiplier "
            f"{sigma * gain:.4g}): an accountant never reports less privacy loss than the "
            "program's noise supports; return the event of every release from `dp_event`"
        )
    return eps


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


def _merge(dp_accounting: Any, first: Any, second: Any) -> Any:
    """Two releases on the same batch: one Gaussian when both are (σ⁻² adds), else composed."""
    if second is None:
        return first
    gaussian = dp_accounting.GaussianDpEvent
    if isinstance(first, gaussian) and isinstance(second, gaussian):
        a, b = float(first.noise_multiplier), float(second.noise_multiplier)
        return gaussian((a**-2 + b**-2) ** -0.5)
    return dp_accounting.ComposedDpEvent([first, second])


def run_event(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    noise: NoiseMechanism | None = None,
    clip: ClipPolicy | None = None,
) -> Any:
    """The ``dp_accounting`` event of a DP run, composed from its parts' own events.

    ``release(k)`` is the gradient's ``GaussianDpEvent(σ)`` merged with the clip policy's
    ``dp_event(k)``; the mechanism's ``dp_event(release, sample_rate=, steps=)`` makes the
    run's event (DP-SGD without one: ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
    release(1)), steps)``). No part is known by its class.

    Args:
        noise_multiplier: the gradient's σ.
        sample_rate: the sampler's rate.
        steps: the noisy steps.
        noise: the `NoiseMechanism`, or ``None``.
        clip: the `ClipPolicy`, or ``None`` for a fixed clip norm.

    Returns:
        A ``dp_accounting.DpEvent``.
    """
    dp_accounting = _dp_accounting("jaxwise.privacy accounting")
    _check_mechanism(noise, clip)

    def release(participations: int) -> Any:
        own = None if clip is None else clip.dp_event(int(participations))
        return _merge(dp_accounting, dp_accounting.GaussianDpEvent(noise_multiplier), own)

    if noise is None:
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(sample_rate, release(1)), int(steps)
        )
    return noise.dp_event(release, sample_rate=sample_rate, steps=int(steps))


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


def _epsilon(event: Any, delta: float, accountant: str) -> float:
    dp_accounting = _dp_accounting("jaxwise.privacy.epsilon")
    acc = _accountant(dp_accounting, accountant)
    with _quiet_absl():  # dp-accounting logs orders it excludes; the result already says all
        acc.compose(event)
        return float(acc.get_epsilon(delta))


def epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int | np.integer,
    delta: float,
    accountant: Accountant = "rdp",
    mechanism: NoiseMechanism | None = None,
    clip: ClipPolicy | None = None,
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
    is included (its ``dp_event`` merged with the gradient's Gaussian). Any mechanism or clip
    policy that gives its own ``dp_event`` is accounted the same way (see
    [`NoiseMechanism`][jaxwise.privacy.NoiseMechanism]).
    Nothing is printed (dp-accounting's absl warnings about excluded RDP orders are hidden).
    The same arguments are computed once per process.

    Args:
        noise_multiplier: σ (noise std / clip norm); 0 gives ε = inf.
        sample_rate: q = expected batch size / dataset size, in (0, 1].
        steps: number of noisy gradient steps.
        delta: δ in (0, 1), typically < 1 / dataset size.
        accountant: ``"rdp"`` or ``"pld"``.
        mechanism: ``None`` (DP-SGD) or a [`NoiseMechanism`][jaxwise.privacy.NoiseMechanism]
            ([`BandMF`][jaxwise.privacy.BandMF], [`BLT`][jaxwise.privacy.BLT], your own).
        clip: the run's [`ClipPolicy`][jaxwise.privacy.ClipPolicy] (e.g.
            [`AdaptiveClip`][jaxwise.privacy.AdaptiveClip]), if any.

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
    _dp_accounting("jaxwise.privacy.epsilon")  # names the extra when it is missing
    check_dp_events(mechanism, clip)
    args = (float(noise_multiplier), float(sample_rate), int(steps), float(delta), accountant)
    return _memoized(_epsilon_of, *args, mechanism, clip)


def _epsilon_of(
    sigma: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str,
    mechanism: NoiseMechanism | None,
    clip: ClipPolicy | None,
) -> float:
    if sigma == 0:
        run_event(1.0, sample_rate, int(steps), mechanism, clip)  # the parts' own checks
        return float("inf")
    event = run_event(sigma, sample_rate, int(steps), mechanism, clip)
    if mechanism is None:
        return _epsilon(event, delta, accountant)
    who = f"`{type(mechanism).__name__}.dp_event`"
    return _check_floor(event, sigma, sample_rate, mechanism, delta, accountant, who)


def _memoized(fn: Callable[..., float], *args: Any) -> float:
    """``fn(*args)``, computed once per process for the same values: accounting is a pure
    function of numbers and of frozen dataclasses (jaxwise's mechanisms and clip policies);
    any other object (one that could change between calls) is computed every time."""
    if all(_is_value(a) for a in args):
        return _memo(fn, *args)
    return fn(*args)


def _is_value(x: Any) -> bool:
    if x is None or isinstance(x, (int, float, str)):
        return True
    params = getattr(type(x), "__dataclass_params__", None)
    if params is None or not params.frozen:
        return False
    try:
        hash(x)
    except TypeError:  # a frozen dataclass holding an array
        return False
    return True


@functools.lru_cache(maxsize=256)
def _memo(fn: Callable[..., float], *args: Any) -> float:
    return fn(*args)


def _bracket(epsilon_of: Callable[[float], float], target: float) -> tuple[float, float]:
    """σ ``(lower, higher)`` a factor of 2 apart with ``ε(lower) > target >= ε(higher)``,
    doubling or halving from σ = 1 within [1e-3, 1e4] (the caller checked ε(1e4) <= target);
    ``(1e-3, 1e-3)`` when even σ = 1e-3 meets the target.

    The bisection then runs on one octave and never evaluates a tiny σ it does not need:
    dp-accounting's PLD of σ = 1e-3 at a sample rate of 1/234 needs a 38 GiB array.
    """
    sigma = 1.0
    if epsilon_of(sigma) > target:  # more noise: double until ε fits
        while True:
            more = min(2 * sigma, 1e4)
            if more == sigma or epsilon_of(more) <= target:
                return sigma, more
            sigma = more
    while sigma > 1e-3:  # less noise: halve while ε still fits
        less = max(sigma / 2, 1e-3)
        if epsilon_of(less) > target:
            return less, sigma
        sigma = less
    return sigma, sigma


def noise_multiplier_for(
    *,
    epsilon: float,
    sample_rate: float,
    steps: int | np.integer,
    delta: float,
    accountant: Accountant = "rdp",
    mechanism: NoiseMechanism | None = None,
    clip: ClipPolicy | None = None,
) -> float:
    """The smallest gradient σ whose ε (``steps`` steps of the run's event) is ``<= epsilon``.

    Uses ``dp_accounting.calibrate_dp_mechanism`` (bisection to a tolerance of 1e-4) on the
    run's event as [`epsilon`][jaxwise.privacy.epsilon] composes it: ``mechanism`` and
    ``clip`` as there (with ``clip``, its own release is accounted and the σ returned is the
    gradient's). Nothing is printed; the same arguments are calibrated once per process.

    Args:
        epsilon: the target ε > 0.
        sample_rate: q = expected batch size / dataset size, in (0, 1].
        steps: number of noisy gradient steps.
        delta: δ in (0, 1).
        accountant: ``"rdp"`` or ``"pld"``.
        mechanism: ``None`` (DP-SGD) or a [`NoiseMechanism`][jaxwise.privacy.NoiseMechanism].
        clip: the run's [`ClipPolicy`][jaxwise.privacy.ClipPolicy], if any.

    Returns:
        The noise multiplier σ.

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range, or a target unreachable with σ ≤ 1e4 (with an
            adaptive clip: its count noise alone spends more than the target).
        ImportError: dp-accounting is not installed (``pip install 'jaxwise[privacy]'``).

    Examples:
        >>> s = noise_multiplier_for(epsilon=3.0, sample_rate=256 / 60000, steps=10000, delta=1e-5)
        >>> e = epsilon(noise_multiplier=s, sample_rate=256 / 60000, steps=10000, delta=1e-5)
        >>> round(e, 2) <= 3.0
        True
    """
    check_float(epsilon, "epsilon", min_value=0.0, min_inclusive=False)
    _check_accounting(sample_rate, steps, delta, accountant)
    _dp_accounting("jaxwise.privacy.noise_multiplier_for")
    check_dp_events(mechanism, clip)
    args = (float(epsilon), float(sample_rate), int(steps), float(delta), accountant)
    return _memoized(_calibrated, *args, mechanism, clip)


def _calibrated(
    target: float,
    sample_rate: float,
    steps: int,
    delta: float,
    accountant: str,
    mechanism: NoiseMechanism | None,
    clip: ClipPolicy | None,
) -> float:
    dp_accounting = _dp_accounting("jaxwise.privacy.noise_multiplier_for")

    def event(sigma: float) -> Any:
        return run_event(sigma, sample_rate, int(steps), mechanism, clip)

    if mechanism is not None:  # its accounting must not fall below its noise (probed at σ = 1)
        who = f"`{type(mechanism).__name__}.dp_event`"
        _check_floor(event(1.0), 1.0, sample_rate, mechanism, delta, accountant, who)
    upper = 1e4
    if _epsilon(event(upper), delta, accountant) > target:
        raise ValueError(
            f"`epsilon` {target} is unreachable: even noise_multiplier={upper:g} gives more "
            f"(sample_rate={sample_rate}, steps={steps}, delta={delta}"
            + ("; the clip policy's own release (raise its count_noise)" if clip else "")
            + ")"
        )
    lower, higher = _bracket(lambda sigma: _epsilon(event(sigma), delta, accountant), target)
    if lower == higher:  # the smallest σ searched already meets the target
        return lower
    with _quiet_absl():  # the bisection composes many accountants; each may log excluded orders
        sigma = dp_accounting.calibrate_dp_mechanism(
            lambda: _accountant(dp_accounting, accountant),
            event,
            target,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(lower, higher),
            tol=1e-4,
        )
    if mechanism is not None:  # the σ found must not rest on an accounting below its noise
        who = f"`{type(mechanism).__name__}.dp_event`"
        _check_floor(event(sigma), sigma, sample_rate, mechanism, delta, accountant, who)
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

    The accounting comes from the gradient's ``requirements.privacy`` (a
    [`DPAccounting`][jaxwise.privacy.DPAccounting]: the noise multiplier, the mechanism and
    the clip policy of a [`dp_gradient_fn`][jaxwise.privacy.dp_gradient_fn], forwarded by
    every wrapper: [`unit_clip`][jaxwise.privacy.unit_clip],
    [`mixed_precision`][jaxwise.train.mixed_precision], yours), the sampling from the
    sampler's one record, ``epoch.facts(n)`` (its method, rate and separation); the pairing
    is checked again (a mechanism whose ``min_separation`` the sampler does not guarantee
    raises `PairingError`), then the
    event its parts give (``dp_event``) is composed as [`epsilon`][jaxwise.privacy.epsilon]
    does.

    Args:
        epoch: a [`TrainEpoch`][jaxwise.train.TrainEpoch] of a DP gradient.
        n: the dataset size the epoch runs over.
        steps: the noisy steps taken (e.g. ``epochs * epoch.steps_per_epoch(n)``).
        delta: δ in (0, 1).
        accountant: ``"rdp"`` or ``"pld"``.

    Returns:
        ε as a float (``inf`` without noise).

    Raises:
        TypeError: ``epoch`` is not a DP epoch, or its mechanism or clip policy gives no
            ``dp_event``.
        PairingError: the epoch's sampler is not Poisson sampling (a shuffle: no amplified
            epsilon is proved for it), or it does not separate participations as its
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
    n = check_int(n, "n", min_value=1)
    return plan_epsilon(privacy_plan(epoch, n), steps=steps, delta=delta, accountant=accountant)


@dataclasses.dataclass(frozen=True)
class PrivacyPlan:
    """Everything the accountant reads about a DP program: one record.

    Attributes:
        accounting: the gradient's `DPAccounting` (noise multiplier, mechanism, clip policy).
        facts: the sampler's `jaxwise.train.SamplingFacts` of an epoch over the dataset.
        sampler: the sampler's name, for messages.
    """

    accounting: DPAccounting
    facts: SamplingFacts
    sampler: str = "the sampler"


def privacy_plan(epoch: TrainEpoch, n: int) -> PrivacyPlan:
    """The `PrivacyPlan` of a DP epoch over ``n`` examples: its gradient's claim and facts.

    Args:
        epoch: a [`TrainEpoch`][jaxwise.train.TrainEpoch] of a DP gradient.
        n: the dataset size.

    Returns:
        The plan.

    Raises:
        TypeError: ``epoch`` is not a DP epoch, or its gradient's ``requirements.privacy`` is
            a claim no DP gradient issued (a wrapper that makes up its own accounting).
    """
    if not isinstance(epoch, TrainEpoch):
        raise TypeError(f"`epoch` must be a jaxwise.train.TrainEpoch, got {type(epoch).__name__}")
    gradient = type(epoch.gradient).__name__
    privacy = epoch.gradient.requirements.privacy  # a declared member of every GradientFn
    if privacy is None:
        raise TypeError(
            "`epoch` must be a TrainEpoch of a DP gradient (privacy.dp_gradient_fn, or a "
            f"wrapper that forwards its `requirements`), got a TrainEpoch of {gradient}"
        )
    if not issued(privacy):
        raise TypeError(
            f"`{gradient}.requirements.privacy` ({privacy!r}) is not the claim of a DP "
            "gradient that adds its noise (privacy.dp_gradient_fn issues one with its noise): "
            "a wrapper must forward the wrapped gradient's `requirements`, never make up its "
            "own accounting, or the ε would not be the program's"
        )
    assert isinstance(privacy, DPAccounting)  # issued() holds only for one
    return PrivacyPlan(privacy, epoch.facts(n), type(epoch.sampler).__name__)


def plan_epsilon(
    plan: PrivacyPlan,
    *,
    steps: int | np.integer,
    delta: float,
    accountant: Accountant = "rdp",
) -> float:
    """ε of ``steps`` steps of a `PrivacyPlan`: the pairing, the sampling method, then the event.

    Args:
        plan: the program's `PrivacyPlan` (`privacy_plan`, or made by hand for a program whose noise
            another library adds, e.g. jax-privacy's ``gaussian_privatizer``).
        steps: the noisy steps taken.
        delta: δ in (0, 1).
        accountant: ``"rdp"`` or ``"pld"``.

    Returns:
        ε as a float (``inf`` without noise).

    Raises:
        PairingError: a sampling that is not Poisson, or that does not separate participations
            as the mechanism assumes.
        TypeError: a part gives no ``dp_event`` (or one that returns no event).
        ValueError: an argument out of range, or an accounting below the program's noise.
    """
    check_int(steps, "steps", min_value=1)
    check_probability(delta, "delta", open_low=True, open_high=True)
    check_choice(accountant, "accountant", ACCOUNTANTS)
    privacy, facts = plan.accounting, plan.facts
    privacy.check_sampler(facts, plan.sampler)
    if not facts.poisson:
        raise PairingError(
            f"`epoch` draws its batches with {plan.sampler} (sampling method {facts.method!r}), "
            "which is not Poisson sampling: the amplified epsilon the accountant computes is "
            "not proved for it (shuffled fixed-size batches get no such amplification). Train "
            "with privacy.PoissonSampler (or CyclicPoissonSampler) for an epsilon, or account "
            "without amplification: privacy.epsilon(..., sample_rate=1.0, steps=...)"
        )
    return epsilon(
        noise_multiplier=privacy.noise_multiplier,
        sample_rate=facts.sized().sample_rate,
        steps=steps,
        delta=delta,
        accountant=accountant,
        mechanism=privacy.noise,
        clip=clip_policy(privacy.clip),
    )

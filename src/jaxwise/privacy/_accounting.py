"""(ε, δ) from dp-accounting's RDP or PLD accountant, and the σ for a target ε."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from jaxwise._checks import (
    check_float,
    check_int,
    check_probability,
)
from jaxwise.privacy._noise import (
    _check_noise,
)

__all__ = ["epsilon", "noise_multiplier_for"]


def _check_accounting(sample_rate: float, steps: int, delta: float) -> None:
    check_probability(sample_rate, "sample_rate", open_low=True)
    check_int(steps, "steps", min_value=1)
    check_probability(delta, "delta", open_low=True, open_high=True)


def _accountant(kind: str) -> Any:
    import dp_accounting

    if kind == "rdp":
        return dp_accounting.rdp.RdpAccountant()
    if kind == "pld":
        return dp_accounting.pld.PLDAccountant()
    raise ValueError(f"`accountant` must be 'rdp' or 'pld', got {kind!r}")


def _event(noise_multiplier: float, sample_rate: float, steps: int) -> Any:
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            sample_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        ),
        int(steps),
    )


def epsilon(
    noise_multiplier: float, sample_rate: float, steps: int, delta: float, accountant: str = "rdp"
) -> float:
    """ε of DP-SGD with Poisson sampling, from dp-accounting (RDP by default, ``"pld"`` optional).

    Args:
      noise_multiplier: σ (noise std / clip norm); 0 gives ε = inf.
      sample_rate: q = expected batch size / dataset size, in (0, 1].
      steps: number of noisy gradient steps.
      delta: δ in (0, 1), typically < 1 / dataset size.
      accountant: ``"rdp"`` or ``"pld"``.

    Examples:
        >>> epsilon(1.0, 0.01, 100, 1e-5) < epsilon(1.0, 0.01, 1000, 1e-5)
        True
    """
    _check_noise(noise_multiplier)
    _check_accounting(sample_rate, steps, delta)
    acc = _accountant(accountant)
    if noise_multiplier == 0:
        return float("inf")
    with _quiet_absl():  # dp-accounting logs orders it excludes; the result already says all
        acc.compose(_event(noise_multiplier, sample_rate, steps))
        return float(acc.get_epsilon(delta))


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


def noise_multiplier_for(
    target_epsilon: float, delta: float, sample_rate: float, steps: int, accountant: str = "rdp"
) -> float:
    """The smallest σ whose ε (Poisson-sampled Gaussian, ``steps`` steps) is ``<= target_epsilon``.

    Uses ``dp_accounting.calibrate_dp_mechanism`` (bisection). Raises
    ``ValueError`` if the target is unreachable with σ ≤ 1e4.

    Examples:
        >>> s = noise_multiplier_for(3.0, 1e-5, 256 / 60000, 10000)
        >>> round(epsilon(s, 256 / 60000, 10000, 1e-5), 2) <= 3.0
        True
    """
    import dp_accounting

    check_float(target_epsilon, "target_epsilon", min_value=0.0, min_inclusive=False)
    _check_accounting(sample_rate, steps, delta)
    _accountant(accountant)
    upper = 1e4
    if epsilon(upper, sample_rate, steps, delta, accountant) > target_epsilon:
        raise ValueError(
            f"`target_epsilon` {target_epsilon} is unreachable: even "
            f"noise_multiplier={upper:g} gives more "
            f"(sample_rate={sample_rate}, steps={steps}, delta={delta})"
        )
    return float(
        dp_accounting.calibrate_dp_mechanism(
            lambda: _accountant(accountant),
            lambda sigma: _event(sigma, sample_rate, steps),
            target_epsilon,
            delta,
            bracket_interval=dp_accounting.ExplicitBracketInterval(1e-3, upper),
            tol=1e-4,
        )
    )

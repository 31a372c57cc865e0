"""Choosing the noise mechanism with the lowest expected error at a target ε."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from jaxwise._shared._checks import check_float, check_int, check_probability
from jaxwise.privacy._accounting._accountant import Accountant, noise_multiplier_for
from jaxwise.privacy._mechanisms._bandmf import BandMF
from jaxwise.privacy._mechanisms._blt import BLT

__all__ = ["MechanismCandidate", "MechanismChoice", "choose_mechanism"]

# At most 8 bands by default: the expected error compared here is that of the prefix sums (a
# model that never forgets noise). Under a loss with curvature, parameters forget noise older
# than ~1/(lr·h) steps and many bands lose their cancellation: at lr·h = 0.003 the 32 and 64
# bands this comparison prefers are worse than DP-SGD while 4-8 keep most of their gain
# (benchmarks/results/mf_why.md; the spiral lost 4.7 points with 32 bands, ties with 8).
DEFAULT_BANDS = (1, 2, 4, 8)


class MechanismCandidate(NamedTuple):
    """One mechanism at the target ε.

    Attributes:
        name: ``"dpsgd"``, ``"bandmf"`` or ``"blt"``.
        mechanism: ``None`` (DP-SGD), the ``BandMF`` or the ``BLT``.
        groups: the ``groups`` of the ``CyclicPoissonSampler`` it trains with.
        noise_multiplier: σ calibrated to the target ε.
        expected_error: ``σ · rmse``: the RMSE of the noise in the model's prefix sums.
        relative: ``expected_error`` over DP-SGD's (below 1: better than DP-SGD).
    """

    name: str
    mechanism: BandMF | BLT | None
    groups: int
    noise_multiplier: float
    expected_error: float
    relative: float


class MechanismChoice(NamedTuple):
    """The result of `choose_mechanism`: the best candidate and all of them.

    Attributes:
        best: the candidate with the lowest expected error (DP-SGD on ties).
        candidates: every candidate evaluated, DP-SGD first.
    """

    best: MechanismCandidate
    candidates: tuple[MechanismCandidate, ...]


def _bandmf_row(
    bands: int, steps: int, q: float, eps: float, delta: float, acc: Accountant, mom: float
) -> tuple[BandMF | None, float, float]:
    mech = BandMF(bands=bands, steps=steps, momentum=mom)
    sigma = noise_multiplier_for(
        epsilon=eps, sample_rate=q, steps=steps, delta=delta, accountant=acc, mechanism=mech
    )
    return (None if bands == 1 else mech), sigma, sigma * mech.strategy.rmse


def choose_mechanism(
    steps: int,
    *,
    epsilon: float,
    delta: float,
    n: int,
    batch_size: int,
    bands: Sequence[int] = DEFAULT_BANDS,
    blt_buffers: Sequence[int] = (2, 3),
    momentum: float = 0.0,
    accountant: Accountant = "rdp",
) -> MechanismChoice:
    """The mechanism with the lowest expected error for ``steps`` steps at ``(epsilon, delta)``.

    For DP-SGD (``bands = 1``) and each ``BandMF(b)`` (trained with
    ``CyclicPoissonSampler(batch_size, groups=b)``, amplified accounting), and each BLT (one
    batch a group: ``groups = n // batch_size``, every example once an epoch, no
    amplification), σ is calibrated to the target and the expected error is ``σ`` times the
    strategy's RMSE. DP-SGD is always a candidate, so the choice is never worse than DP-SGD
    in expected error. Band counts with ``b · batch_size > n`` or ``b > steps`` are skipped.

    Args:
        steps: the training steps.
        epsilon: the target ε > 0.
        delta: δ in (0, 1).
        n: the dataset size.
        batch_size: the expected batch size.
        bands: the band counts to try (1 = DP-SGD is always added); more than 8 bands only
            help models that forget noise slowly (see the privacy guide).
        blt_buffers: the BLT buffer counts to try (empty: none).
        momentum: the workload's momentum (see `bandmf_strategy`).
        accountant: ``"rdp"`` or ``"pld"``.

    Returns:
        A [`MechanismChoice`][jaxwise.privacy.MechanismChoice].

    Raises:
        TypeError: an argument of the wrong type.
        ValueError: an argument out of range.

    Examples:
        >>> c = choose_mechanism(200, epsilon=3.0, delta=1e-5, n=2000, batch_size=100,
        ...                      bands=(1, 2, 4), blt_buffers=())
        >>> c.best.relative <= 1.0, c.candidates[0].name
        (True, 'dpsgd')
    """
    steps = check_int(steps, "steps", min_value=1)
    n = check_int(n, "n", min_value=1)
    batch_size = check_int(batch_size, "batch_size", min_value=1, max_value=n)
    check_float(epsilon, "epsilon", min_value=0.0, min_inclusive=False)
    check_probability(delta, "delta", open_low=True, open_high=True)
    tried = sorted({1, *(check_int(b, "bands", min_value=1) for b in bands)})
    rows: list[MechanismCandidate] = []
    for b in tried:
        if b > steps or b * batch_size > n:
            continue
        q = min(1.0, batch_size / (n // b))
        mech, sigma, err = _bandmf_row(b, steps, q, epsilon, delta, accountant, momentum)
        base = err if b == 1 else rows[0].expected_error
        rows.append(
            MechanismCandidate("dpsgd" if b == 1 else "bandmf", mech, b, sigma, err, err / base)
        )
    groups = max(1, n // batch_size)
    for k in blt_buffers:
        blt = BLT(buffers=k, steps=steps, min_sep=groups, momentum=momentum)
        sigma = noise_multiplier_for(
            epsilon=epsilon,
            sample_rate=1.0,
            steps=steps,
            delta=delta,
            accountant=accountant,
            mechanism=blt,
        )
        err = sigma * blt.strategy.rmse
        rows.append(
            MechanismCandidate("blt", blt, groups, sigma, err, err / rows[0].expected_error)
        )
    best = min(rows, key=lambda r: (r.expected_error, r.name != "dpsgd"))
    return MechanismChoice(best, tuple(rows))

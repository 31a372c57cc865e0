"""Every sampler of jaxwise: `ShuffleSampler`, `PoissonSampler`, `CyclicPoissonSampler`.

Each states its facts in the one record of `jaxwise.train._program._sampling`
(`SamplingFacts`), which is all that the program and the accountant read; ``jaxwise.privacy``
re-exports the last two.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_int
from jaxwise._shared._random import flat_draw, poisson_batch
from jaxwise._shared._shuffle import shuffle_hash
from jaxwise.buckets import plan_buckets
from jaxwise.train._program._sampling import (
    POISSON_METHODS,
    Sampler,
    SamplingFacts,
    SamplingMethod,
)

__all__ = [
    "POISSON_METHODS",
    "CyclicPoissonSampler",
    "PoissonSampler",
    "Sampler",
    "SamplingFacts",
    "SamplingMethod",
    "ShuffleSampler",
    "shuffle_hash",
]


@dataclasses.dataclass(frozen=True)
class ShuffleSampler:
    """One random permutation per epoch cut into ``n // batch_size`` batches (remainder dropped).

    The permutation sorts the examples by a keyed integer hash of their index: ``h(i) =
    mix(mix(i + s) ^ k1)`` with ``mix`` the bijective "lowbias32" mixer (Wellons, 2018) and the
    seed ``s`` mixed from the state's key data and step counter. ``h`` is a bijection of the
    32-bit integers, so there are no ties and the result is a permutation; the key is not
    consumed (each epoch starts at another step, so each gets another order). It is a shuffle for
    SGD, not a cryptographic one: it compiles to one elementwise fusion and one sort, where
    ``jax.random.bits`` would add a Threefry loop to every epoch program (about a tenth of the
    spiral epoch's compile time). Privacy-critical sampling (DP-SGD) uses ``jax.random``.

    Attributes:
        batch_size: rows per batch, >= 1.

    Raises:
        TypeError: ``batch_size`` is not an int.
        ValueError: ``batch_size < 1``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> xs, key = ShuffleSampler(4).plan(jax.random.key(0), jnp.int32(0), 10)
        >>> xs.shape
        (2, 4)
    """

    batch_size: int

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", min_value=1)

    def facts(self, n: int | None) -> SamplingFacts:
        """``method="shuffle"``, ``n // batch_size`` steps of ``batch_size`` rows, separation 1.

        Args:
            n: the number of examples, or ``None`` for the n-free facts.

        Returns:
            The `SamplingFacts`.

        Raises:
            ValueError: ``batch_size > n``.

        Examples:
            >>> ShuffleSampler(4).facts(10).steps
            2
        """
        return _facts(self, n, "shuffle")

    def check(self, n: int) -> None:
        """Refuse a dataset smaller than one batch.

        Args:
            n: the number of examples.

        Raises:
            ValueError: ``batch_size > n``.
        """
        if self.batch_size > n:
            raise ValueError(
                f"`batch_size` {self.batch_size} is larger than the dataset ({n} examples)"
            )

    def steps(self, n: int) -> int:
        """``n // batch_size``: the remainder is dropped.

        Args:
            n: the number of examples.

        Returns:
            The steps per epoch.
        """
        return n // self.batch_size

    def width(self, n: int) -> int:
        """``batch_size``: no padding.

        Args:
            n: the number of examples (unused).

        Returns:
            The batch width.
        """
        del n
        return self.batch_size

    def widths(self, n: int) -> tuple[int, ...]:
        """``(batch_size,)``: every step runs at the one width.

        Args:
            n: the number of examples (unused).

        Returns:
            The widths.
        """
        return (self.width(n),)

    def sample_rate(self, n: int) -> float:
        """``batch_size / n``.

        Args:
            n: the number of examples.

        Returns:
            The fraction of the examples in one batch.
        """
        return self.batch_size / n

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
        """The epoch's permutation, cut into batches.

        Args:
            key: the state's key (not consumed).
            step: the state's step counter.
            n: the number of examples.

        Returns:
            ``(indices, key)``: int32 ``(steps, batch_size)`` rows of each step, and ``key``
                unchanged.
        """
        steps = self.steps(n)
        order = jnp.argsort(shuffle_hash(key, step, n))
        return order[: steps * self.batch_size].reshape(steps, self.batch_size), key

    def draw(self, x: jax.Array, n: int) -> tuple[jax.Array, None, dict[str, Any]]:
        """One step's rows: the plan's row, every one real.

        Args:
            x: the step's indices ``(batch_size,)``.
            n: the number of examples (unused).

        Returns:
            ``(x, None, {})``.
        """
        del n
        return x, None, {}


@dataclasses.dataclass(frozen=True)
class PoissonSampler:
    """Poisson sampling, a `jaxwise.train.Sampler`: rate ``q = batch_size / n``.

    Each step draws its own batch with `poisson_batch`: ``X ~ Binomial(n, q)`` real
    examples, padded with a mask to at most ``width(n)`` rows (the expected size plus twelve
    standard deviations, rounded up to a multiple of ``multiple``, e.g. the devices of a
    mesh); ``round(n / batch_size)`` steps per epoch.

    Padded rows cost a real row's work, so a step does not run at ``width(n)``: it runs at
    the smallest of ``widths(n)`` that holds its ``X`` examples, ``buckets`` padded widths
    chosen by [`plan_buckets`][jaxwise.buckets.plan_buckets] from the binomial distribution
    of ``X`` (the expected padding is minimised exactly; the largest width is ``width(n)``,
    almost never used, so its size costs compile time and memory, not run time). With 5
    buckets a step at ``batch_size = 64`` costs about 1.07 expected batches. The accounting
    is unchanged: every example is still included with probability ``q``; only a step with
    more than ``width(n)`` examples is truncated, with probability
    ``overflow_probability(n)`` (about 1e-25 at ``batch_size = 64``), see the privacy guide.

    Attributes:
        batch_size: the expected batch size, >= 1.
        multiple: the padded width is a multiple of it, >= 1.
        buckets: how many padded widths the steps run at (1 to 16).

    Raises:
        TypeError: a field is not an int.
        ValueError: a field is < 1.

    Examples:
        >>> PoissonSampler(64).width(60000), PoissonSampler(64).steps(60000)
        (161, 938)
        >>> PoissonSampler(64).widths(60000)
        (60, 67, 74, 86, 161)
        >>> f"{PoissonSampler(64).overflow_probability(60000):.1e}"
        '7.9e-25'
    """

    batch_size: int
    multiple: int = 1
    buckets: int = 5

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", min_value=1)
        check_int(self.multiple, "multiple", min_value=1)
        check_int(self.buckets, "buckets", min_value=1, max_value=16)

    def facts(self, n: int | None) -> SamplingFacts:
        """``method="poisson"``: rate ``batch_size / n``, separation 1, the padded widths.

        Args:
            n: the dataset size, or ``None`` for the n-free facts.

        Returns:
            The `SamplingFacts` (``expected_batch_size = sample_rate(n) · n``).

        Raises:
            ValueError: ``batch_size > n``.
        """
        return _facts(self, n, "poisson")

    def check(self, n: int) -> None:
        """``ValueError`` if the batch size exceeds the ``n`` examples.

        Args:
            n: the dataset size.

        Raises:
            ValueError: ``batch_size > n``.
        """
        if self.batch_size > n:
            raise ValueError(
                f"`batch_size` {self.batch_size} is larger than the dataset ({n} examples)"
            )

    def sample_rate(self, n: int) -> float:
        """``q = batch_size / n``: each example's probability of joining a batch.

        Args:
            n: the dataset size.

        Returns:
            The sampling rate.
        """
        return self.batch_size / n

    def steps(self, n: int) -> int:
        """Steps per epoch, ``round(n / batch_size)``.

        Args:
            n: the dataset size.

        Returns:
            The steps per epoch, >= 1.
        """
        return max(1, int(round(n / self.batch_size)))

    def width(self, n: int) -> int:
        """The largest padded batch width: expected size + 12 standard deviations, rounded up.

        Args:
            n: the dataset size.

        Returns:
            The width, at most ``n`` before rounding up to ``multiple``.
        """
        expected = self.batch_size
        cap = int(min(n, np.ceil(expected + 12 * np.sqrt(expected) + 1)))
        return self._round(cap)

    def _round(self, width: int) -> int:
        return -(-width // self.multiple) * self.multiple

    def widths(self, n: int) -> tuple[int, ...]:
        """The padded widths of the steps: ``buckets`` of them, the last one ``width(n)``.

        Args:
            n: the dataset size.

        Returns:
            The widths, increasing.
        """
        cap = self.width(n)
        pmf = _binomial_pmf(n, self.batch_size / n, min(cap, n))
        cdf = np.cumsum(pmf) / pmf.sum()
        quantiles = np.searchsorted(cdf, (np.arange(_QUANTILES) + 0.5) / _QUANTILES)
        planned = plan_buckets([*quantiles.tolist(), cap], self.buckets)
        return tuple(sorted({min(self._round(w), cap) for w in planned}))

    def overflow_probability(self, n: int) -> float:
        """``P(X > width(n))`` for ``X ~ Binomial(n, q)``: a step's chance of truncation.

        Args:
            n: the dataset size.

        Returns:
            The probability (0.0 when ``width(n) >= n``).
        """
        cap = self.width(n)
        if cap >= n:
            return 0.0
        # beyond 40 standard deviations above the mean the terms are below 1e-300
        upper = min(n, cap + 40 * int(np.sqrt(self.batch_size)) + 40)
        return float(_binomial_pmf(n, self.batch_size / n, upper)[cap + 1 :].sum())

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
        """One sampling key per step of the epoch, and the state's next key.

        Args:
            key: the state's key.
            step: the state's step counter (unused).
            n: the dataset size.

        Returns:
            ``(keys, next_key)``: one sampling key per step, and the state's next key.
        """
        del step
        key, plan_key = jax.random.split(key)
        return jax.random.split(plan_key, self.steps(n)), key

    def draw(self, x: jax.Array, n: int) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
        """One step's Poisson batch: ``(indices, mask, {"overflow": ...})``.

        Args:
            x: the step's sampling key.
            n: the dataset size.

        Returns:
            ``(indices (width,), mask (width,), {"overflow": bool scalar})``.
        """
        idx, mask, overflow = poisson_batch(x, n, self.batch_size / n, self.width(n))  # x: a key
        return idx, mask, {"overflow": overflow}


_QUANTILES = 2000  # the binomial distribution as a sample of equally likely quantiles


def _binomial_pmf(n: int, q: float, upper: int) -> np.ndarray:
    """``P(X = k)`` for ``k = 0..upper``, ``X ~ Binomial(n, q)``, in float64 (log-gamma form)."""
    k = np.arange(upper + 1, dtype=np.float64)
    if q >= 1.0:
        return (k == n).astype(np.float64)
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    log_choose = math.lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0)
    return np.exp(log_choose + k * np.log(q) + (n - k) * np.log1p(-q))


@dataclasses.dataclass(frozen=True)
class CyclicPoissonSampler:
    """Poisson sampling within ``groups`` fixed groups, one group a step, cyclically.

    Example ``i`` belongs to group ``i mod groups``; step ``t`` (the state's step counter)
    samples group ``t mod groups``, each of its members independently with probability
    ``q = batch_size / (n // groups)`` (`sample_rate`), so an example joins at most once every
    ``groups`` steps: what banded matrix factorization (``BandMF(bands)`` with
    ``groups >= bands``) needs for its amplified accounting, and BLT's ``min_sep``. Batches
    are padded with the out-of-range index ``n`` (a ``mode="fill"`` gather reads zeros, never
    a real row) to the padded-width ladder of a
    [`PoissonSampler`][jaxwise.privacy.PoissonSampler] over a group; ``round(n / batch_size)``
    steps an epoch. ``groups = 1`` is Poisson sampling.

    Attributes:
        batch_size: the expected batch size, >= 1.
        groups: the number of groups, >= 1.
        multiple: the padded width is a multiple of it.
        buckets: how many padded widths the steps run at (1 to 16).

    Raises:
        TypeError: a field is not an int.
        ValueError: a field is < 1.

    Examples:
        >>> s = CyclicPoissonSampler(16, groups=4)
        >>> s.sample_rate(1000), s.steps(1000), s.width(1000) == s.widths(1000)[-1]
        (0.064, 62, True)
    """

    batch_size: int
    groups: int = 1
    multiple: int = 1
    buckets: int = 5

    def __post_init__(self) -> None:
        check_int(self.groups, "groups", min_value=1)
        self._poisson()  # validates the other fields

    def facts(self, n: int | None) -> SamplingFacts:
        """``method="cyclic_poisson"``: its group's rate, separation ``groups``.

        The expected batch size is ``sample_rate(n) · n / groups`` (a step samples one group
        of about ``n / groups`` examples), about ``batch_size``, not ``sample_rate(n) · n``:
        the DP gradient's denominator.

        Args:
            n: the dataset size, or ``None`` for the n-free facts.

        Returns:
            The `SamplingFacts`.

        Raises:
            ValueError: ``groups · batch_size > n``.
        """
        return _facts(self, n, "cyclic_poisson", groups=self.groups)

    def _poisson(self) -> PoissonSampler:
        return PoissonSampler(self.batch_size, self.multiple, self.buckets)

    def check(self, n: int) -> None:
        """``ValueError`` unless every group holds ``batch_size`` examples.

        Args:
            n: the dataset size.

        Raises:
            ValueError: ``groups · batch_size > n``.
        """
        if self.groups * self.batch_size > n:
            raise ValueError(
                f"`groups` * `batch_size` ({self.groups} * {self.batch_size}) is larger than "
                f"the dataset ({n} examples): each group must hold a batch"
            )

    def steps(self, n: int) -> int:
        """Steps per epoch, ``round(n / batch_size)``.

        Args:
            n: the dataset size.

        Returns:
            The steps per epoch, >= 1.
        """
        return self._poisson().steps(n)

    def width(self, n: int) -> int:
        """The largest padded width: a Poisson sampler's over the largest group.

        Args:
            n: the dataset size.

        Returns:
            The width.
        """
        return max(self._poisson().width(-(-n // self.groups)), self.widths(n)[-1])

    def widths(self, n: int) -> tuple[int, ...]:
        """The padded widths of the steps, increasing, the last one `width`.

        Args:
            n: the dataset size.

        Returns:
            The widths.
        """
        poisson = self._poisson()
        largest = poisson.width(-(-n // self.groups))
        below = [w for w in poisson.widths(max(1, n // self.groups)) if w < largest]
        return (*below, largest)

    def sample_rate(self, n: int) -> float:
        """The rate ``q = batch_size / (n // groups)`` of a step's group, for the accountant.

        Args:
            n: the dataset size.

        Returns:
            ``q`` (at most 1).
        """
        return min(1.0, self.batch_size / max(1, n // self.groups))

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[Any, jax.Array]:
        """Per step of the epoch: a sampling key and the group; and the state's next key.

        Args:
            key: the state's key.
            step: the state's step counter (the first step's group is ``step mod groups``).
            n: the dataset size.

        Returns:
            ``((keys, groups (steps,) int32), next_key)``.
        """
        key, plan_key = jax.random.split(key)
        count = self.steps(n)
        start = jnp.asarray(step, jnp.int32) % self.groups
        group = (start + jnp.arange(count, dtype=jnp.int32)) % self.groups
        return (jax.random.split(plan_key, count), group), key

    def draw(self, x: Any, n: int) -> tuple[jax.Array, jax.Array, dict[str, Any]]:
        """One step's batch from its group: ``(indices, mask, {"overflow": ...})``.

        Args:
            x: ``(key, group)`` of the step (from `plan`).
            n: the dataset size.

        Returns:
            ``(indices (width,), mask (width,), {"overflow": bool scalar})``.
        """
        key, group = x
        slots = -(-n // self.groups)
        members = group + self.groups * jnp.arange(slots, dtype=jnp.int32)
        rate = self.sample_rate(n)
        chosen = flat_draw(lambda k, shape: jax.random.bernoulli(k, rate, shape), key, slots)
        chosen = chosen & (members < n)
        count = jnp.sum(chosen.astype(jnp.int32))
        width = self.width(n)
        (where,) = jnp.nonzero(chosen, size=width, fill_value=slots)
        idx = jnp.where(where < slots, group + self.groups * where, n).astype(jnp.int32)
        mask = jnp.arange(width) < count
        return idx, mask, {"overflow": count > width}


def _facts(sampler: Any, n: int | None, method: SamplingMethod, groups: int = 1) -> SamplingFacts:
    """The `SamplingFacts` of one of the samplers here: ``groups`` disjoint groups take turns
    (1: every step may draw any example), so an example's steps are ``groups`` apart and a
    step's expected batch is one group's share of ``sample_rate(n) · n``."""
    base: dict[str, Any] = {
        "method": method,
        "min_separation": groups,
        "batch_size": float(sampler.batch_size),
    }
    if n is None:
        return SamplingFacts(**base)
    sampler.check(n)
    rate = sampler.sample_rate(n)
    return SamplingFacts(
        **base,
        examples=int(n),
        steps=sampler.steps(n),
        width=sampler.width(n),
        widths=sampler.widths(n),
        sample_rate=rate,
        expected_batch_size=rate * n / groups,
    )

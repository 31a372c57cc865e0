"""Cyclic Poisson sampling: step ``t`` Poisson-samples group ``t mod groups``."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from jaxwise._checks import check_int
from jaxwise._random import flat_draw
from jaxwise.privacy._epoch import PoissonSampler

__all__ = ["CyclicPoissonSampler"]


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

    @property
    def poisson_sampled(self) -> bool:
        """``True``: every example joins its group's steps independently (the amplification by
        sampling that `epoch_epsilon` accounts for holds).

        Returns:
            ``True``.
        """
        return True

    @property
    def min_separation(self) -> int:
        """``groups``: an example's participations lie at least ``groups`` steps apart.

        Returns:
            ``groups``.
        """
        return self.groups

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

    def expected_batch_size(self, n: int) -> float:
        """The expected size of a step's batch, ``sample_rate(n) · n / groups``.

        A step samples one group (about ``n / groups`` examples) at `sample_rate`, so this
        is about ``batch_size``, not ``sample_rate(n) · n``: the DP gradient's denominator.

        Args:
            n: the dataset size.

        Returns:
            The expected batch size (a data-independent constant).
        """
        return self.sample_rate(n) * n / self.groups

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

"""How an epoch draws its mini-batches: the `Sampler` protocol and `ShuffleSampler`."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from jaxwise._checks import check_int
from jaxwise._shuffle import shuffle_hash

__all__ = ["Sampler", "ShuffleSampler", "shuffle_hash"]


@runtime_checkable
class Sampler(Protocol):
    """How an epoch draws its mini-batches from ``n`` examples, inside the compiled program.

    ``plan(key, step, n) -> (xs, key)`` runs once per epoch with the state's key and step
    counter; it returns the scanned-over ``xs`` (leading axis: steps) and the state's next key
    (a sampler that draws from ``jax.random`` splits it; one that does not returns it as it is).
    ``draw(x, n)`` runs in every step and returns ``(indices (width,), mask (width,) or
    None, metrics)``; padding indices (masked out) are ``n``: they gather zeros.
    ``steps(n)`` and ``width(n)`` are Python ints; ``check(n)`` raises
    ``ValueError`` for a dataset the sampler cannot use.

    ``widths(n)`` are ascending padded widths, the last one ``width(n)``; with a mask each
    step runs its gradient at the smallest width that holds its
    real examples (their indices come first), one branch of a ``lax.switch`` per width, so
    padding costs at most the gap to the next width instead of ``width(n) - count``.
    """

    def check(self, n: int) -> None:
        """Refuse a dataset the sampler cannot draw from.

        Args:
            n: the number of examples.

        Raises:
            ValueError: the sampler cannot draw batches from ``n`` examples.
        """
        ...

    def steps(self, n: int) -> int:
        """The number of steps of an epoch.

        Args:
            n: the number of examples.

        Returns:
            The steps per epoch.
        """
        ...

    def width(self, n: int) -> int:
        """The (static) number of rows of every batch.

        Args:
            n: the number of examples.

        Returns:
            The batch width (padded rows included).
        """
        ...

    def widths(self, n: int) -> tuple[int, ...]:
        """The padded widths a step may run at, ascending; the last one is ``width(n)``.

        Args:
            n: the number of examples.

        Returns:
            The widths (one, ``(width(n),)``, for a sampler without a mask).
        """
        ...

    def sample_rate(self, n: int) -> float:
        """The (expected) fraction of the ``n`` examples in one batch, for privacy accounting.

        Args:
            n: the number of examples.

        Returns:
            ``q`` in ``(0, 1]``.
        """
        ...

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[Any, jax.Array]:
        """The epoch's plan, traced once per epoch.

        Args:
            key: the state's key.
            step: the state's step counter.
            n: the number of examples.

        Returns:
            ``(xs, next_key)``: what the scan iterates over (leading axis: steps) and the
                state's key for after the epoch.
        """
        ...

    def draw(self, x: Any, n: int) -> tuple[jax.Array, jax.Array | None, dict[str, Any]]:
        """One step's batch, traced inside the scan.

        Args:
            x: this step's slice of the plan's ``xs``.
            n: the number of examples.

        Returns:
            ``(indices, mask, metrics)``: int ``(width,)`` rows to gather, bool ``(width,)``
                real rows (``None`` when all are real), and extra per-step metrics.
        """
        ...


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

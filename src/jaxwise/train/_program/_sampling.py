"""The sampler protocol and its one record of facts: `Sampler`, `SamplingFacts`.

A `Sampler` states its facts in ONE record, `SamplingFacts` (``sampler.facts(n)``): the steps
of an epoch, the padded widths, the sample rate, the expected batch size, the minimum
separation of an example's participations and the sampling method. `make_epoch`, the DP
gradient's pairing check and the accountant read only that record, so a wrapper that forwards
the protocol's three members (``facts``, ``plan``, ``draw``) trains, pairs and is accounted
exactly as the sampler it wraps. (Anchor: jax-privacy's ``DpParams`` and
``BatchSelectionStrategy``.) The samplers themselves live in `jaxwise.train._program._sampler`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, Protocol, runtime_checkable

import jax

from jaxwise._shared._checks import check_choice, check_float, check_int

__all__ = ["METHODS", "POISSON_METHODS", "Sampler", "SamplingFacts", "SamplingMethod", "SizedFacts"]

SamplingMethod = Literal["shuffle", "poisson", "cyclic_poisson"]
METHODS: tuple[str, ...] = ("shuffle", "poisson", "cyclic_poisson")
POISSON_METHODS: tuple[str, ...] = ("poisson", "cyclic_poisson")
"""The methods whose every example joins a step independently (amplification by sampling)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SamplingFacts:
    """Every sampling fact the program and the accountant need: what ``sampler.facts(n)`` returns.

    The n-free facts (``method``, ``min_separation``, ``batch_size``) are always set; the
    others describe an epoch over ``examples`` examples and are ``None`` in the record of
    ``facts(None)`` (what `make_epoch` checks the pairing with before any data is seen).

    Attributes:
        method: ``"shuffle"`` (fixed-size batches of one permutation: no amplification by
            sampling), ``"poisson"`` (every example joins each step independently) or
            ``"cyclic_poisson"`` (Poisson within one group a step, groups in turn).
        min_separation: the fewest steps between two batches that hold one example, >= 1.
        batch_size: the configured (expected) batch size, > 0.
        examples: ``n``, the dataset size (``None``: n-free record).
        steps: the steps of an epoch over ``n`` examples.
        width: the largest (static) batch width, padding rows included.
        widths: the ascending padded widths a step may run at; the last is ``width``.
        sample_rate: each eligible example's probability of joining a step, in ``(0, 1]``
            (a cyclic sampler: its group's rate), for the accountant.
        expected_batch_size: the expected size of a step's batch: the data-independent
            constant a DP gradient divides its noisy sum by.

    Raises:
        TypeError: a field of the wrong type.
        ValueError: a field out of range, ``widths`` not ascending or not ending at
            ``width``, or only some of the n-dependent facts given.

    Examples:
        >>> from jaxwise.train import CyclicPoissonSampler, PoissonSampler
        >>> PoissonSampler(64).facts(60000).widths
        (60, 67, 74, 86, 161)
        >>> CyclicPoissonSampler(16, groups=4).facts(None).min_separation
        4
    """

    method: SamplingMethod
    min_separation: int
    batch_size: float
    examples: int | None = None
    steps: int | None = None
    width: int | None = None
    widths: tuple[int, ...] | None = None
    sample_rate: float | None = None
    expected_batch_size: float | None = None

    def __post_init__(self) -> None:
        check_choice(self.method, "method", METHODS)
        check_int(self.min_separation, "min_separation", min_value=1)
        check_float(self.batch_size, "batch_size", min_value=0.0, min_inclusive=False)
        sized = (self.steps, self.width, self.widths, self.sample_rate, self.expected_batch_size)
        if self.examples is None:
            if any(v is not None for v in sized):
                raise ValueError("`examples` must be given with the n-dependent facts")
            return
        check_int(self.examples, "examples", min_value=1)
        if any(v is None for v in sized):
            raise ValueError(
                "a record with `examples` must give `steps`, `width`, `widths`, "
                "`sample_rate` and `expected_batch_size`"
            )
        check_int(self.steps, "steps", min_value=1)
        check_int(self.width, "width", min_value=1)
        widths = tuple(int(check_int(w, "widths", min_value=1)) for w in self.widths or ())
        if not widths or list(widths) != sorted(set(widths)) or widths[-1] != self.width:
            raise ValueError(
                f"`widths` must ascend strictly and end at `width` {self.width}, got {widths}"
            )
        object.__setattr__(self, "widths", widths)
        rate = self.sample_rate
        if not (isinstance(rate, float | int) and 0.0 < float(rate) <= 1.0):
            raise ValueError(f"`sample_rate` must be in (0, 1], got {rate!r}")
        check_float(
            self.expected_batch_size, "expected_batch_size", min_value=0.0, min_inclusive=False
        )

    @property
    def poisson(self) -> bool:
        """Every eligible example joins each step independently (``method`` in POISSON_METHODS)."""
        return self.method in POISSON_METHODS

    def sized(self) -> SizedFacts:
        """The n-dependent facts, typed as present.

        Returns:
            A `SizedFacts` view.

        Raises:
            ValueError: the record is n-free (``facts(None)``).
        """
        if self.examples is None:
            raise ValueError("the sampler's facts were taken without `n` (facts(None))")
        assert self.steps is not None and self.width is not None and self.widths is not None
        assert self.sample_rate is not None and self.expected_batch_size is not None
        return SizedFacts(
            self.examples,
            self.steps,
            self.width,
            self.widths,
            float(self.sample_rate),
            float(self.expected_batch_size),
        )


@dataclasses.dataclass(frozen=True)
class SizedFacts:
    """The n-dependent part of a `SamplingFacts`, every field present (`SamplingFacts.sized`)."""

    examples: int
    steps: int
    width: int
    widths: tuple[int, ...]
    sample_rate: float
    expected_batch_size: float


@runtime_checkable
class Sampler(Protocol):
    """How an epoch draws its mini-batches from ``n`` examples, inside the compiled program.

    Three members, and a wrapper that forwards them is the sampler it wraps:

    - ``facts(n) -> SamplingFacts``: every fact the program and the accountant read (steps,
      widths, sample rate, expected batch size, minimum separation, method); ``facts(None)``
      the n-free ones. It raises ``ValueError`` for a dataset the sampler cannot use.
    - ``plan(key, step, n) -> (xs, key)`` runs once per epoch with the state's key and step
      counter; it returns the scanned-over ``xs`` (leading axis: steps) and the state's next
      key (a sampler that draws from ``jax.random`` splits it; one that does not returns it).
    - ``draw(x, n)`` runs in every step and returns ``(indices (width,), mask (width,) or
      None, metrics)``; padding indices (masked out) are ``n``: they gather zeros.

    With a mask each step runs its gradient at the smallest of ``facts(n).widths`` that
    holds its real examples (their indices come first), one branch of a ``lax.switch`` per
    width, so padding costs at most the gap to the next width.
    """

    def facts(self, n: int | None) -> SamplingFacts:
        """Every sampling fact of an epoch over ``n`` examples (``None``: the n-free ones).

        Args:
            n: the number of examples, or ``None``.

        Returns:
            The `SamplingFacts`.

        Raises:
            ValueError: the sampler cannot draw batches from ``n`` examples.
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
                real rows (``None`` when all are real: every index then in ``[0, n)``), and
                extra per-step metrics.
        """
        ...

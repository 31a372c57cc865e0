"""DP-SGD as a gradient function: clipping policies and noise mechanisms plug into it.

`dp_gradient_fn` returns a `DPGradientFn`, a `jaxwise.train.GradientFn`: each step clips
every example's gradient to norm ``C``, sums, adds ``noise_multiplier · C · noise`` and
divides by the expected batch size the program passes in its ``context``. ``noise`` comes
from a `NoiseMechanism` (``None``: independent Gaussian noise, DP-SGD) that turns this
step's standard-normal draw ``z`` into the noise (correlated across steps for
matrix-factorization mechanisms); ``C`` from a float or a `ClipPolicy` (adaptive
clipping). Its state, ``{"noise": mechanism state, "clip": policy state}`` (``()`` for an
absent part), lives in ``TrainState.gradient_state``.

A mechanism states the participation its accounting assumes (``min_separation``: an example
joins at most once in that many steps) and a sampler's `SamplingFacts` the separation it
guarantees;
`make_epoch` refuses a pairing where the sampler guarantees less with a `PairingError`. The
gradient's privacy travels with it: its ``requirements.privacy`` is a `DPAccounting` (the
noise multiplier, the mechanism and the clip policy), which a wrapper forwards, which
`make_epoch` checks against the sampler and which the accountant composes (each mechanism
and clip policy gives its own ``dp_event``). A call whose ``context.privacy`` is not the
gradient's own (a wrapper that hides it) is refused.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jax

from jaxwise._errors import JaxwiseError
from jaxwise._shared._extras import require
from jaxwise._typing import ClipState, Grads, NoiseState, Params, PyTree
from jaxwise.train import SamplingFacts

if TYPE_CHECKING:  # dp-accounting is the `privacy` extra
    from dp_accounting import DpEvent

__all__ = [
    "ClipPolicy",
    "DPAccounting",
    "NoiseMechanism",
    "PairingError",
    "check_dp_events",
    "check_pairing",
    "clip_policy",
    "issue",
    "issued",
    "poisson_event",
]


class PairingError(JaxwiseError, ValueError):
    """A noise mechanism paired with a sampler its privacy accounting does not cover.

    BandMF's amplified accounting assumes every example joins at most once every ``bands``
    steps (BLT: every ``min_sep`` steps); a sampler that may put an example in two closer
    steps (Poisson, shuffled batches) voids the guarantee, so the pairing is refused when
    the epoch is made.

    Examples:
        >>> issubclass(PairingError, ValueError)
        True
    """

    __module__ = "jaxwise.privacy"


@runtime_checkable
class NoiseMechanism(Protocol):
    """How a step's standard-normal draw becomes its noise (``None`` in `dp_gradient_fn`: z).

    ``init(params)`` is the state before the first step (a pytree of arrays, e.g. the
    buffers of earlier draws); ``correlate(state, z)`` returns ``(noise, new_state)`` with
    ``noise`` a tree like ``z``, for a unit clip norm and unit noise multiplier: the gradient
    adds ``noise_multiplier · C · noise``. `dp_gradient_fn` passes the whole draw as ONE flat
    vector (the parameters' ``P`` entries padded to a multiple of 8, their common dtype;
    ``init`` gets zeros of that shape; the padding's noise is dropped), so a mechanism written
    for any tree costs a few operations per step whatever the number of leaves.
    ``min_separation`` is the fewest steps between two participations of one example that its
    accounting assumes (1: any sampler); `make_epoch` refuses a sampler that guarantees fewer
    (`PairingError`). ``dp_event(release, sample_rate=, steps=)`` is its accounting: a
    ``dp_accounting`` ``DpEvent`` of the whole run, built from ``release(k)``, the event of
    one release of the noisy gradient covering ``k`` participations of an example (the
    gradient's Gaussian, merged with a clip policy's own release): DP-SGD is
    ``SelfComposedDpEvent(PoissonSampledDpEvent(sample_rate, release(1)), steps)``.
    """

    @property
    def min_separation(self) -> int:
        """Steps between two participations of an example that the accounting assumes.

        Returns:
            An int >= 1.
        """
        ...

    def init(self, params: Params) -> NoiseState:
        """The state before the first step.

        Args:
            params: a tree like the draws ``z`` (for the shapes of buffers).

        Returns:
            A pytree of arrays (``()`` for none).
        """
        ...

    def correlate(self, state: NoiseState, z: Grads) -> tuple[PyTree, PyTree]:
        """This step's noise from its standard-normal draw.

        Args:
            state: the mechanism's state.
            z: a standard-normal tree like ``params``.

        Returns:
            ``(noise, new_state)``.
        """
        ...

    def dp_event(
        self, release: Callable[[int], DpEvent], *, sample_rate: float, steps: int
    ) -> DpEvent:
        """The accounting event of ``steps`` steps.

        Args:
            release: ``release(k)``: the event of one release covering ``k`` participations.
            sample_rate: the sampler's rate (one group's for a cyclic sampler).
            steps: the noisy steps.

        Returns:
            A ``dp_accounting.DpEvent``.

        Raises:
            ValueError: ``steps`` beyond what the mechanism's sensitivity covers.
        """
        ...


def _pairing_message(noise: Any, sampler: str, have: int) -> str:
    need = 1 if noise is None else int(noise.min_separation)
    return (
        f"`noise` {noise} needs every example to join at most once every {need} steps "
        f"(its privacy accounting assumes it), but `sampler` {sampler} "
        f"guarantees {have}: train it with privacy.CyclicPoissonSampler(batch_size, "
        f"groups={need}) (or more groups)"
    )


def check_pairing(noise: NoiseMechanism | None, facts: SamplingFacts, name: str) -> None:
    """`PairingError` unless the sampling separates participations as ``noise`` assumes.

    Args:
        noise: the noise mechanism (``None``: DP-SGD, any sampler).
        facts: the sampler's `SamplingFacts` (``min_separation`` is read).
        name: the sampler's name, for the message.

    Raises:
        PairingError: the sampler guarantees fewer steps between an example's
            participations than the mechanism's ``min_separation``.
    """
    need = 1 if noise is None else int(noise.min_separation)
    have = int(facts.min_separation)
    if have < need:
        raise PairingError(_pairing_message(noise, name, have))


@runtime_checkable
class ClipPolicy(Protocol):
    """A clip norm that changes during training (e.g. `AdaptiveClip`), passed as ``clip_norm=``.

    ``norm(state)`` is this step's clip norm (a float32 scalar); ``update(state, norms, mask,
    normal, expected_batch_size)`` the next state from the step's pre-clip per-example norms
    and ``normal``, a standard-normal float32 scalar drawn with the step's gradient noise and
    independent of it (the policy's own noise, e.g. for a private count). ``dp_event(k)`` is
    the policy's own release for ``k`` participations of an example (a ``dp_accounting``
    ``DpEvent``; ``None`` when its clip norm releases nothing about the data, e.g. a
    schedule), which the accountant merges with the gradient's.
    """

    def init(self) -> ClipState:
        """The state before the first step (a pytree of arrays).

        Returns:
            The state.
        """
        ...

    def norm(self, state: ClipState) -> jax.Array:
        """This step's clip norm.

        Args:
            state: the policy's state.

        Returns:
            A float32 scalar > 0.
        """
        ...

    def update(
        self,
        state: ClipState,
        norms: jax.Array,
        mask: jax.Array | None,
        normal: jax.Array,
        expected_batch_size: float,
    ) -> ClipState:
        """The state after a step.

        Args:
            state: the policy's state.
            norms: float32 ``(B,)`` pre-clip per-example norms.
            mask: bool ``(B,)`` real examples, or ``None``.
            normal: a standard-normal float32 scalar, independent of the gradient's noise.
            expected_batch_size: the sampler's expected batch size.

        Returns:
            The new state.
        """
        ...

    def dp_event(self, participations: int) -> DpEvent | None:
        """The policy's own release for ``participations`` participations of an example.

        Args:
            participations: the participations one accounted release covers.

        Returns:
            A ``dp_accounting.DpEvent``, or ``None`` for a policy that releases nothing.
        """
        ...


def clip_policy(clip_norm: float | ClipPolicy) -> ClipPolicy | None:
    """``clip_norm`` when it is a `ClipPolicy`, ``None`` for a fixed clip norm."""
    return clip_norm if isinstance(clip_norm, ClipPolicy) else None


@dataclasses.dataclass(frozen=True, eq=False)
class DPAccounting:
    """How a DP gradient's privacy is accounted: its ``requirements.privacy``.

    One object per `DPGradientFn`, compared by identity: the programs pass it to the gradient
    in ``context.privacy`` and the gradient refuses a call that carries another (a wrapper
    that does not forward ``requirements``). `make_epoch` calls ``check_sampler``; the
    accountant (`epoch_epsilon`) reads the record and accepts only one a DP gradient issued
    (`issued`): a claim a wrapper makes up (``DPAccounting(50.0, ...)`` around a σ = 0.5
    gradient) accounts noise the program never adds.

    Attributes:
        noise_multiplier: ``σ`` of the gradient's noise.
        noise: the `NoiseMechanism` (``None``: DP-SGD).
        clip: the clip norm or the `ClipPolicy`.
    """

    noise_multiplier: float
    noise: NoiseMechanism | None
    clip: float | ClipPolicy

    @property
    def min_separation(self) -> int:
        """The separation of participations the accounting assumes (1 for DP-SGD)."""
        return 1 if self.noise is None else int(self.noise.min_separation)

    def check_sampler(self, facts: SamplingFacts, name: str = "the sampler") -> None:
        """`PairingError` unless the sampling separates participations as ``noise`` assumes.

        Args:
            facts: the sampler's `SamplingFacts` (``sampler.facts(n)``, or ``facts(None)``).
            name: the sampler's name, for the message.

        Raises:
            PairingError: e.g. ``BandMF(bands=4)`` with a ``PoissonSampler``.
        """
        check_pairing(self.noise, facts, name)

    def __repr__(self) -> str:
        return (
            f"DPAccounting(noise_multiplier={self.noise_multiplier}, noise={self.noise!r}, "
            f"clip={self.clip!r})"
        )


_ISSUED: weakref.WeakSet[DPAccounting] = weakref.WeakSet()


def issue(accounting: DPAccounting) -> DPAccounting:
    """Mark ``accounting`` as the claim of a gradient that adds its noise (`DPGradientFn`)."""
    _ISSUED.add(accounting)
    return accounting


def issued(accounting: object) -> bool:
    """Whether ``accounting`` is a claim a DP gradient issued (made with its noise)."""
    return isinstance(accounting, DPAccounting) and accounting in _ISSUED


def _check_mechanism(mechanism: Any, clip: Any) -> None:
    """Each must give its own accounting event (``dp_event``): no list of known classes."""
    if mechanism is not None and not callable(getattr(mechanism, "dp_event", None)):
        raise TypeError(
            "`mechanism` must be None (DP-SGD) or a privacy.NoiseMechanism with its own "
            f"`dp_event` (BandMF, BLT or your own), got {type(mechanism).__name__}"
        )
    if clip is not None and not callable(getattr(clip, "dp_event", None)):
        raise TypeError(
            "`clip` must be None or a privacy.ClipPolicy with its own `dp_event` (e.g. "
            f"AdaptiveClip), got {type(clip).__name__}"
        )


def check_dp_events(mechanism: Any, clip: Any) -> None:
    """Ask each part for its event once, now: a ``dp_event`` that returns no ``DpEvent`` is
    refused by name where the part is handed over, not after training when ε is asked.

    ``mechanism.dp_event(release, sample_rate=0.5, steps=1)`` must return a
    ``dp_accounting.DpEvent``; ``clip.dp_event(1)`` one or ``None``. Without dp-accounting
    installed there is nothing to check against (ε then needs the extra anyway).

    Args:
        mechanism: a `NoiseMechanism`, or ``None``.
        clip: a `ClipPolicy`, or ``None``.

    Raises:
        TypeError: a ``dp_event`` that returns something else (the part and ``dp_event``
            named).
    """
    _check_mechanism(mechanism, clip)
    if mechanism is None and clip is None:
        return  # nothing to ask (and dp-accounting stays unimported)
    try:
        import dp_accounting
    except ImportError:  # no accountant installed: nothing to check the events against
        return
    event_type = dp_accounting.DpEvent
    if clip is not None:
        own = clip.dp_event(1)
        if own is not None and not isinstance(own, event_type):
            raise TypeError(_not_an_event(clip, "dp_event(1)", own, allow_none=True))
    if mechanism is not None:

        def release(k: int) -> Any:
            del k
            return dp_accounting.GaussianDpEvent(1.0)

        event = mechanism.dp_event(release, sample_rate=0.5, steps=1)
        if not isinstance(event, event_type):
            raise TypeError(_not_an_event(mechanism, "dp_event(release, ...)", event))


def _not_an_event(part: Any, call: str, got: Any, *, allow_none: bool = False) -> str:
    return (
        f"`{type(part).__name__}.{call}` must return a dp_accounting.DpEvent"
        + (" (or None)" if allow_none else "")
        + f", got {type(got).__name__} {got!r:.60}: the accountant composes the run's "
        "privacy from it"
    )


def poisson_event(release: Any, sample_rate: float, compositions: int) -> Any:
    """``SelfComposedDpEvent(PoissonSampledDpEvent(q, release), compositions)``.

    The event of a mechanism whose example participates Poisson-sampled ``compositions``
    times (DP-SGD: every step; amplified BandMF: every ``bands`` steps).
    """
    dp_accounting = require("dp_accounting", extra="privacy", feature="jaxwise.privacy accounting")
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, release), int(compositions)
    )

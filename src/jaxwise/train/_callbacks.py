"""What `fit` is composed with: its callbacks (checkpointing, metric logging, progress, resume).

`fit` takes one list, ``callbacks``. Each entry is a plain function of the
[`FitCallback`][jaxwise.train.FitCallback] protocol (called after every batch with the state it
produced), or one of four small typed objects that `fit` recognises, as Lightning's trainer
recognises its ``ModelCheckpoint``: [`Checkpointing`][jaxwise.train.Checkpointing],
[`MetricLogging`][jaxwise.train.MetricLogging], [`ProgressBar`][jaxwise.train.ProgressBar] and
[`Resume`][jaxwise.train.Resume]. Each object checks its own arguments when it is made.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from jaxwise._checks import check_int
from jaxwise.train._state import TrainState

__all__ = ["Checkpointing", "FitCallback", "MetricLogging", "ProgressBar", "Resume"]


class Writer(Protocol):
    """A `jaxwise.metrics.MetricWriter` (structural: ``train`` does not import ``metrics``)."""

    def write(self, step: int, scalars: Mapping[str, float], /) -> None: ...

    def flush(self) -> None: ...


class Saver(Protocol):
    """What `fit` saves checkpoints with: a `jaxwise.checkpoint.Checkpointer`.

    A structural type, so that ``train`` does not import ``checkpoint`` (the layer above it).
    An optional ``wait()`` finishes an asynchronous save in flight (raising its error).
    """

    def save(self, tree: TrainState, metadata: dict[str, Any] | None = None, /) -> Any: ...


@runtime_checkable
class FitCallback(Protocol):
    """What `fit` calls after each batch: early stopping, validation, a display of your own, ….

    Called with the state the batch produced, the batch's number (counted across resumed
    runs, as the writers see it) and its scalar metrics as floats; returning True stops
    ``fit`` after that batch (it saves a checkpoint then, as at the end of the data). A plain
    function is one; `fit` waits for each batch's metrics while one is given.

    Examples:
        >>> def stop_below(state, batch, scalars):
        ...     return scalars["loss"] < 1e-3
        >>> isinstance(stop_below, FitCallback)
        True
    """

    def __call__(
        self, state: TrainState, batch: int, scalars: Mapping[str, float]
    ) -> bool | None: ...


@dataclasses.dataclass(frozen=True)
class Checkpointing:
    """Save the state every ``every`` batches and at the end (one asynchronous save in flight).

    Each checkpoint's metadata is ``metadata`` as it is at that save (read then: a dict the
    caller updates is saved current) plus ``"fit"``: the batch count, the position of a
    `StatefulIterator` and a fingerprint of the data; pass it back in
    [`Resume`][jaxwise.train.Resume] to continue exactly. Metric writers are flushed before
    each save; a writer whose flush fails never costs the checkpoint (saved first, then the
    writer's error is raised). The save in flight is finished on return, on any exception and
    on SIGTERM.

    Attributes:
        checkpointer: a `jaxwise.checkpoint.Checkpointer` (left open).
        every: save every this many batches (``None``: at the end only).
        metadata: JSON metadata of every checkpoint.

    Raises:
        TypeError: ``checkpointer`` has no ``save(state, metadata)``; ``every`` is not an int.
        ValueError: ``every`` < 1.

    Examples:
        >>> class Keep:  # any object with save(state, metadata), e.g. a Checkpointer
        ...     def save(self, state, metadata=None):
        ...         print("saved", metadata["fit"]["batches"])
        >>> Checkpointing(Keep(), every=100).every
        100
    """

    checkpointer: Saver
    every: int | None = None
    metadata: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not callable(getattr(self.checkpointer, "save", None)):
            raise TypeError(
                "`checkpointer` must be a jaxwise.checkpoint.Checkpointer (an object with "
                f"`save(state, metadata)`), got {type(self.checkpointer).__name__}"
            )
        if self.every is not None:
            check_int(self.every, "every", min_value=1)
        if self.metadata is not None and not isinstance(self.metadata, Mapping):
            raise TypeError(f"`metadata` must be a dict, got {type(self.metadata).__name__}")


@dataclasses.dataclass(frozen=True)
class MetricLogging:
    """Write every ``every``-th batch's scalar metrics to ``writers`` at its batch number.

    Batch numbers are counted across resumed runs. The writers are flushed before each
    checkpoint and at the end, and left open. Metrics are read from the device one batch
    late (the next batch is queued first), so logging does not stall the device.

    Attributes:
        writers: `jaxwise.metrics` writers (``write(step, scalars)``, ``flush()``).
        every: write every this many batches.

    Raises:
        TypeError: ``writers`` is not a list of writers.
        ValueError: ``every`` < 1.

    Examples:
        >>> class Print:
        ...     def write(self, step, scalars): print(step, scalars)
        ...     def flush(self): pass
        >>> len(MetricLogging([Print()], every=10).writers)
        1
    """

    writers: Sequence[Writer]
    every: int = 1

    def __post_init__(self) -> None:
        if not isinstance(self.writers, (list, tuple)):
            raise TypeError(
                f"`writers` must be a list of metric writers, got {type(self.writers).__name__}"
            )
        for i, w in enumerate(self.writers):
            if not (callable(getattr(w, "write", None)) and callable(getattr(w, "flush", None))):
                raise TypeError(
                    f"`writers[{i}]` must be a jaxwise.metrics.MetricWriter (write, flush, "
                    f"close), got {type(w).__name__}"
                )
        check_int(self.every, "every", min_value=1)
        object.__setattr__(self, "writers", tuple(self.writers))


@dataclasses.dataclass(frozen=True)
class ProgressBar:
    """A progress bar on stderr with the loss and the skipped-step count (needs rich, ``cli``).

    Examples:
        >>> ProgressBar()
        ProgressBar()
    """


@dataclasses.dataclass(frozen=True)
class Resume:
    """Continue the run that saved a checkpoint: its batch count and its data position.

    With ``metadata`` (from `jaxwise.checkpoint.load_metadata`; restore the state yourself)
    `fit` counts batches on from the saved count, moves a `StatefulIterator` (a grain loader)
    to its saved position, skips the batches of a list already trained, and refuses data whose
    fingerprint (length, a hash of its first records) differs from the saved run's. A plain
    iterator cannot be moved: `fit` warns (`ResumeWarning`) unless ``positioned=True`` says the
    caller already started it after the trained batches (an ``itertools.repeat`` needs
    nothing).

    Attributes:
        metadata: the checkpoint's metadata (its ``"fit"`` entry is what `fit` reads).
        positioned: the caller positioned ``batches`` already: `fit` does not move them (nor
            warn); it continues the batch count and still compares the data's fingerprint.

    Raises:
        TypeError: ``metadata`` is not a mapping.

    Examples:
        >>> Resume.after(12).metadata
        {'fit': {'batches': 12}}
    """

    metadata: Mapping[str, Any]
    positioned: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, Mapping):
            raise TypeError(
                "`metadata` must be the checkpoint's metadata (a mapping, from "
                f"checkpoint.load_metadata), got {type(self.metadata).__name__}"
            )

    @classmethod
    def after(cls, batches: int) -> Resume:
        """Count on from ``batches`` trained batches; the data is positioned by the caller.

        Args:
            batches: the number of batches already trained.

        Returns:
            A ``Resume`` with ``positioned=True``.
        """
        return cls({"fit": {"batches": check_int(batches, "batches", min_value=0)}}, True)


@dataclasses.dataclass(frozen=True)
class Plan:
    """`fit`'s ``callbacks`` sorted by role (at most one checkpointing, bar, resume)."""

    functions: tuple[FitCallback, ...] = ()
    logging: tuple[MetricLogging, ...] = ()
    checkpointing: Checkpointing | None = None
    progress: bool = False
    resume: Resume | None = None


_ONE = {Checkpointing: "checkpointing", ProgressBar: "progress", Resume: "resume"}


def plan(callbacks: Any) -> Plan:
    """``callbacks`` checked and sorted by role.

    Raises:
        TypeError: ``callbacks`` is not a list, or an entry is neither callable nor a known object.
        ValueError: two `Checkpointing`, `ProgressBar` or `Resume` objects.
    """
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"`callbacks` must be a list, got {type(callbacks).__name__}")
    found: dict[str, Any] = {"functions": [], "logging": []}
    for i, callback in enumerate(callbacks):
        role = next((name for kind, name in _ONE.items() if isinstance(callback, kind)), None)
        if role is not None:
            if role in found:
                raise ValueError(
                    f"`callbacks[{i}]` is a second {type(callback).__name__}: give at most one"
                )
            found[role] = True if role == "progress" else callback
        elif isinstance(callback, MetricLogging):
            found["logging"].append(callback)
        elif callable(callback):
            found["functions"].append(callback)
        else:
            raise TypeError(
                f"`callbacks[{i}]` must be callable as callback(state, batch, scalars), or a "
                "Checkpointing, MetricLogging, ProgressBar or Resume, "
                f"got {type(callback).__name__}"
            )
    found["functions"], found["logging"] = tuple(found["functions"]), tuple(found["logging"])
    return Plan(**found)

"""What `fit` is composed with: the `Callback` protocol, the run a callback sees, `Resume`.

A callback is any object with a cadence ``every`` and three hooks, ``on_start(run)``,
``on_step(step, state, metrics)`` and ``on_end(step, state)`` (Keras' ``Callback``, CLU's
``PeriodicAction``); one may also keep state across a resumed run with ``state_dict()`` and
``load_state_dict(state)`` (Lightning's ``Callback.state_dict``): it is saved in every
checkpoint `fit` writes and handed back by ``fit(..., resume=...)``. The ones jaxwise ships
(`Checkpointing`, `MetricLogging`, `ProgressBar`, `EarlyStopping`) are ordinary callbacks.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import jax
import numpy as np

from jaxwise._shared._checks import check_int, is_int
from jaxwise.train._loop._data_state import ResumeError, ResumeWarning
from jaxwise.train._program._state import TrainState

if TYPE_CHECKING:
    from jaxwise.train._loop._data_state import DataPosition

__all__ = ["Callback", "FitRun", "LambdaCallback", "Resume"]


@runtime_checkable
class Callback(Protocol):
    """What `fit` calls: at the start, at every ``every``-th step, and at the end.

    Subclass it to inherit hooks that do nothing (``every`` is 1), or write any class with
    these four members. ``step`` is the number of the batch just trained, counted across
    resumed runs (the first batch is 1), and a callback is due at the steps that are a
    multiple of its ``every``. ``metrics`` are the step's scalar metrics; they are read from
    the device when a callback first looks at one (one transfer for all), so a callback that
    does not look costs no wait. An optional ``state_dict()`` (a JSON-able dict) and
    ``load_state_dict(state)`` carry a callback's state across a resumed run: the state is
    saved in every checkpoint and restored by ``fit(..., resume=...)``, keyed by the class
    name (``"EarlyStopping"``, a second one ``"EarlyStopping#2"``).

    Attributes:
        every: call ``on_step`` at every this many steps (``None``: never; ``on_end`` only).

    Examples:
        >>> class StopBelow(Callback):
        ...     def on_step(self, step, state, metrics):
        ...         return metrics["loss"] < 1e-3
        >>> isinstance(StopBelow(), Callback), StopBelow().every
        (True, 1)
    """

    every: int | None = 1

    def on_start(self, run: FitRun) -> None:
        """Called once before the first step, with what the callback may need of the run.

        Args:
            run: the run: its first step, its length, its callbacks, the checkpoint record.
        """

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> bool | None:
        """Called after each due step with the state it produced (valid until the next step).

        Args:
            step: the number of the batch just trained.
            state: the state after it.
            metrics: its scalar metrics (read from the device when first looked at).

        Returns:
            True to stop `fit` after this step (it ends as at the end of the data); False
                or None to go on. Anything else is refused, naming the callback.
        """

    def on_end(self, step: int, state: TrainState | None) -> None:
        """Called once when `fit` ends: finish the work in flight (a save, a flush, a bar).

        Args:
            step: the number of the last batch trained.
            state: the final state; ``None`` when `fit` is ending by an exception (a failed
                step, Ctrl-C, SIGTERM): finish what is in flight, start nothing new.
        """


class FitRun:
    """The run a callback is part of, handed to ``on_start`` (made by `fit`).

    Args:
        first: batches trained before this call.
        total: batches this call will train, when known.
        callbacks: the run's callbacks, in order.
        position: where `fit` is in its data (what a checkpoint records of it).

    Attributes:
        first: batches trained before this `fit` call (a resumed run's count; else the
            state's step).
        total: batches this call will train, when known (``steps``, or ``len(batches)``).
        callbacks: every callback of the run, in the order `fit` calls them.
        checkpoints: the steps saved so far (a saver appends each, once saved).
    """

    def __init__(
        self,
        first: int,
        total: int | None,
        callbacks: tuple[Any, ...],
        position: DataPosition,
    ) -> None:
        self.first, self.total, self.callbacks = first, total, callbacks
        self.checkpoints: list[int] = []
        self._position = position
        self._hooks: list[Callable[[], None]] = []
        self._keys = _state_keys(callbacks)

    def before_save(self, hook: Callable[[], None]) -> None:
        """Have ``hook()`` called before every checkpoint of this run is saved.

        `MetricLogging` flushes its writers there, so that they hold every step a checkpoint
        holds (a run resumed from it never misses a logged step).

        Args:
            hook: a function of no arguments.
        """
        self._hooks.append(hook)

    def prepare_save(self) -> None:
        """Run the ``before_save`` hooks, each one; the first error is raised after all ran.

        Raises:
            Exception: the first hook's error (later ones as notes).
        """
        first: Exception | None = None
        for hook in self._hooks:
            try:
                hook()
            except Exception as err:
                if first is None:
                    first = err
                else:
                    first.add_note(f"and another hook before the save failed too: {err}")
        if first is not None:
            raise first

    def record(self, batches: int, state: TrainState) -> dict[str, Any]:
        """What a checkpoint of ``state`` after ``batches`` batches saves as ``metadata["fit"]``.

        The batch count, the state's step, the data's position and fingerprint, and the
        state of every callback that has one.

        Args:
            batches: the number of the last batch trained.
            state: the state saved.

        Returns:
            A JSON-able dict; ``fit(..., resume=metadata)`` continues from it.
        """
        step = int(state.step)
        record = {**self._position.saved(batches), "step": step}
        states = {key: callback.state_dict() for key, callback in self._keys.items()}
        if states:
            record["callbacks"] = states
        return record

    def load(self, saved: Mapping[str, Any]) -> None:
        """Hand each callback its saved state; warn about a saved state nobody takes.

        Args:
            saved: a checkpoint's ``metadata["fit"]``.
        """
        states = saved.get("callbacks")
        if not isinstance(states, Mapping):
            return
        for key, state in states.items():
            callback = self._keys.get(key)
            if callback is None or not callable(getattr(callback, "load_state_dict", None)):
                warnings.warn(
                    f"the checkpoint holds the state of a callback {key!r} that none of "
                    "`callbacks` takes (its state is not restored); pass the same callbacks "
                    "as the run that saved it",
                    ResumeWarning,
                    stacklevel=4,
                )
                continue
            callback.load_state_dict(state)


def _state_keys(callbacks: Sequence[Any]) -> dict[str, Any]:
    """The callbacks with a ``state_dict``, keyed by class name (``Name#2`` for a second)."""
    keys: dict[str, Any] = {}
    counts: dict[str, int] = {}
    for callback in callbacks:
        if not callable(getattr(callback, "state_dict", None)):
            continue
        name = type(callback).__name__
        counts[name] = counts.get(name, 0) + 1
        keys[name if counts[name] == 1 else f"{name}#{counts[name]}"] = callback
    return keys


_NUMBERS = (jax.Array, np.ndarray, np.generic, int, float)


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The 0-d numeric entries of a step's metrics, as floats (one transfer for all)."""
    chosen = {
        k: v
        for k, v in metrics.items()  # a has_aux dict (or None) is not a scalar metric
        if isinstance(k, str) and isinstance(v, _NUMBERS) and np.ndim(v) == 0
    }
    return {k: float(v) for k, v in jax.device_get(chosen).items()}


class StepMetrics(Mapping[str, float]):
    """A step's scalar metrics, read from the device when first looked at (one transfer)."""

    def __init__(self, raw: Mapping[str, Any]) -> None:
        self._raw = raw
        self._read: dict[str, float] | None = None

    def _values(self) -> dict[str, float]:
        if self._read is None:
            self._read = scalars(self._raw)
        return self._read

    def __getitem__(self, key: str) -> float:
        return self._values()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values())

    def __len__(self) -> int:
        return len(self._values())

    def __repr__(self) -> str:
        return f"StepMetrics({self._values()!r})"

    def loss_and_skipped(self) -> tuple[float, int]:
        """The step's loss (NaN without one) and skipped count, reading only those two."""
        if self._read is None:
            values = scalars({k: self._raw[k] for k in ("loss", "skipped") if k in self._raw})
        else:
            values = self._read
        return float(values.get("loss", np.nan)), int(values.get("skipped", 0))


class LambdaCallback(Callback):
    """A function as a callback: ``on_step(step, state, metrics)`` at every ``every``-th step.

    Args:
        on_step: called as ``on_step(step, state, metrics)``; returning True stops `fit`.
        every: its cadence.

    Raises:
        TypeError: ``on_step`` is not callable.
        ValueError: ``every`` < 1.

    Examples:
        >>> stop = LambdaCallback(lambda step, state, metrics: metrics["loss"] < 1e-3, every=10)
        >>> stop.every
        10
    """

    def __init__(
        self,
        on_step: Callable[[int, TrainState, Mapping[str, float]], bool | None],
        every: int = 1,
    ) -> None:
        if isinstance(on_step, type) or not callable(on_step):
            raise TypeError(
                "`on_step` must be a function on_step(step, state, metrics), "
                f"got {type(on_step).__name__}"
            )
        self.function = on_step
        self.every = check_int(every, "every", min_value=1)

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> bool | None:
        """Call the function.

        Args:
            step: the number of the batch just trained.
            state: the state after it.
            metrics: its scalar metrics.

        Returns:
            The function's answer.
        """
        return self.function(step, state, metrics)

    def __repr__(self) -> str:
        name = getattr(self.function, "__name__", type(self.function).__name__)
        return f"LambdaCallback({name}, every={self.every})"


@dataclasses.dataclass(frozen=True)
class Resume:
    """How `fit` continues a checkpointed run (``fit(..., resume=...)``).

    With ``metadata`` (from `jaxwise.checkpoint.load_metadata` of the step restored) `fit`
    counts batches on from the saved count, moves a `StatefulIterator` (a grain loader) to its
    saved position, skips the batches of a list already trained, restores the callbacks'
    states, refuses data whose fingerprint differs from the saved run's, and refuses a state
    of another step than the metadata's. ``fit(..., resume=metadata)`` is the same as
    ``resume=Resume(metadata)``. A plain iterator cannot be moved: `fit` warns
    (`ResumeWarning`) unless ``positioned=True`` says the caller already started it after the
    trained batches (an ``itertools.repeat`` needs nothing).

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

    @property
    def record(self) -> Mapping[str, Any]:
        """The metadata's ``"fit"`` entry (empty when it has none)."""
        record = self.metadata.get("fit", {})
        return record if isinstance(record, Mapping) else {}

    def check_state(self, state: TrainState) -> None:
        """Refuse a ``state`` of another step than the checkpoint the metadata describes.

        Args:
            state: the state `fit` is to continue from.

        Raises:
            ResumeError: the metadata records another step than ``state.step``.
        """
        saved = self.record.get("step")
        if saved is None or not is_int(saved) or int(saved) == int(state.step):
            return
        raise ResumeError(
            f"`resume` is the metadata of the checkpoint of step {int(saved)}, but `state` is "
            f"at step {int(state.step)}: they come from different checkpoints (restore skips a "
            "damaged newest step and restores the one before). Pass the metadata of the step "
            "restored: load_metadata(path, step=int(state.step))"
        )


def as_resume(resume: Any) -> Resume | None:
    """``fit``'s ``resume`` argument as a `Resume` (a mapping is the checkpoint's metadata)."""
    if resume is None or isinstance(resume, Resume):
        return resume
    if isinstance(resume, Mapping):
        return Resume(resume)
    raise TypeError(
        "`resume` must be a checkpoint's metadata (a mapping, from checkpoint.load_metadata) "
        f"or a train.Resume, got {type(resume).__name__}"
    )


_MOVED: dict[type, str] = {
    Resume: "Resume is no longer a callback: pass it as fit(..., resume=...)",
}


def check_callbacks(callbacks: Any) -> tuple[Any, ...]:
    """``callbacks`` checked: each a `Callback` with a valid cadence.

    Raises:
        TypeError: ``callbacks`` is not a list, or an entry is not a callback.
        ValueError: an entry's ``every`` is < 1.
    """
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"`callbacks` must be a list, got {type(callbacks).__name__}")
    for i, callback in enumerate(callbacks):
        missing = [
            name
            for name in ("on_start", "on_step", "on_end")
            if not callable(getattr(callback, name, None))
        ]
        if missing or isinstance(callback, type) or not hasattr(callback, "every"):
            hint = _MOVED.get(type(callback))
            if hint is None and callable(callback):
                hint = (
                    "a function is one as train.LambdaCallback(fn, every=...), called as "
                    "fn(step, state, metrics)"
                )
            raise TypeError(
                f"`callbacks[{i}]` must be a train.Callback (every, on_start, on_step, "
                f"on_end), got {_name(callback)}" + (f": {hint}" if hint else "")
            )
        every = callback.every
        if every is not None and (not is_int(every) or int(every) < 1):
            raise (TypeError if not is_int(every) else ValueError)(
                f"`callbacks[{i}]` ({_name(callback)}) has `every` = {every!r}: it must be an "
                "int >= 1 or None"
            )
    return tuple(callbacks)


def _name(callback: Any) -> str:
    return callback.__name__ if isinstance(callback, type) else type(callback).__name__


def check_answer(answer: Any, i: int, callback: Any, step: int) -> bool:
    """A callback's answer at ``step`` as a bool (True: stop); anything but a bool refused.

    Raises:
        TypeError: the answer is not True, False or None.
    """
    if answer is None:
        return False
    if isinstance(answer, (bool, np.bool_)):
        return bool(answer)
    raise TypeError(
        f"`callbacks[{i}]` ({_name(callback)}).on_step returned {type(answer).__name__} "
        f"{str(answer)[:60]!r} at step {step}: it must return True (stop), False or None"
    )

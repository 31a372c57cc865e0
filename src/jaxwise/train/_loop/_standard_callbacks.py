"""The callbacks jaxwise ships: checkpointing, metric logging, a progress bar, early stopping.

Each is an ordinary [`Callback`][jaxwise.train.Callback]: it does its own work in its hooks
and checks its arguments when it is made.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from jaxwise._shared._checks import check_int, is_int
from jaxwise._shared._progress import progress_bar
from jaxwise.train._loop._callbacks import Callback, FitRun
from jaxwise.train._program._state import TrainState

__all__ = ["Checkpointing", "EarlyStopping", "MetricLogging", "ProgressBar"]


class Writer(Protocol):
    """A `jaxwise.metrics.MetricWriter` (structural: ``train`` does not import ``metrics``)."""

    def write(self, step: int, scalars: Mapping[str, float], /) -> None: ...

    def flush(self) -> None: ...


class Saver(Protocol):
    """What `Checkpointing` saves with: a `jaxwise.checkpoint.Checkpointer`.

    A structural type, so that ``train`` does not import ``checkpoint`` (the layer above it).
    An optional ``wait()`` finishes an asynchronous save in flight (raising its error).
    """

    def save(self, tree: TrainState, metadata: dict[str, Any] | None = None, /) -> Any: ...


def _not_started(name: str) -> FitRun:
    raise RuntimeError(f"{name} is used by `fit` only (its on_start was not called)")


class Checkpointing(Callback):
    """Save the state every ``every`` steps and at the end (one asynchronous save in flight).

    Each checkpoint's metadata is ``metadata`` as it is at that save plus ``"fit"``: the batch
    count, the state's step, the position of a `StatefulIterator`, a fingerprint of the data
    and the callbacks' states; pass it back as ``fit(..., resume=metadata)`` to continue
    exactly. The run's ``before_save`` hooks run first (the metric writers are flushed); one
    that fails never costs the checkpoint (saved first, then its error is raised). The save in
    flight is finished when `fit` returns, on any exception and on SIGTERM. `fit` calls a
    ``Checkpointing`` after the other callbacks of a step, so the checkpoint holds what they
    did at that step.

    Args:
        checkpointer: a `jaxwise.checkpoint.Checkpointer` instance (left open).
        every: save every this many steps (``None``: at the end only).
        metadata: JSON metadata of every checkpoint.

    Raises:
        TypeError: ``checkpointer`` is a class or has no ``save(state, metadata)``; ``every``
            is not an int; ``metadata`` is not a dict.
        ValueError: ``every`` < 1.

    Examples:
        >>> class Keep:  # any object with save(state, metadata), e.g. a Checkpointer
        ...     def save(self, state, metadata=None):
        ...         print("saved", metadata["fit"]["batches"])
        >>> Checkpointing(Keep(), every=100).every
        100
    """

    def __init__(
        self,
        checkpointer: Saver,
        every: int | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(checkpointer, type):
            raise TypeError(
                f"`checkpointer` must be a checkpointer instance, got the class "
                f"{checkpointer.__name__}: make one, e.g. Checkpointing({checkpointer.__name__}"
                "(path), ...)"
            )
        if not callable(getattr(checkpointer, "save", None)):
            raise TypeError(
                "`checkpointer` must be a jaxwise.checkpoint.Checkpointer (an object with "
                f"`save(state, metadata)`), got {type(checkpointer).__name__}"
            )
        if every is not None:
            check_int(every, "every", min_value=1)
        if metadata is not None and not isinstance(metadata, Mapping):
            raise TypeError(f"`metadata` must be a dict, got {type(metadata).__name__}")
        self.checkpointer, self.every, self.metadata = checkpointer, every, metadata
        self._run: FitRun | None = None
        self._saved: set[int] = set()

    def __repr__(self) -> str:
        return f"Checkpointing({type(self.checkpointer).__name__}, every={self.every})"

    def on_start(self, run: FitRun) -> None:
        """Start a run: nothing saved yet.

        Args:
            run: the run (its ``record`` is what a checkpoint saves as ``"fit"``).
        """
        self._run, self._saved = run, set()

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> None:
        """Save ``state`` (asynchronously: the previous save is finished first).

        Args:
            step: the number of the batch just trained.
            state: the state after it.
            metrics: not used.
        """
        del metrics
        self._save(step, state)

    def on_end(self, step: int, state: TrainState | None) -> None:
        """Save the final state (unless saved or ``state`` is None); wait for the save.

        Args:
            step: the number of the last batch trained.
            state: the final state (None: `fit` is failing; only the save in flight ends).
        """
        failure: BaseException | None = None
        try:
            if state is not None:
                self._save(step, state)
        except BaseException as err:
            failure = err
            raise
        finally:
            _finish_saves(self.checkpointer, failure)

    def _save(self, step: int, state: TrainState) -> None:
        """Save ``state`` unless it is saved already; the before-save hooks run first."""
        run = self._run or _not_started("Checkpointing")
        number = int(state.step)
        if number in self._saved:
            return
        failure: Exception | None = None
        try:
            run.prepare_save()  # the writers hold every step the checkpoint holds
        except Exception as err:  # never costs the checkpoint: save, then raise it
            failure = err
        record = run.record(step, state)
        self.checkpointer.save(state, {**(self.metadata or {}), "fit": record})
        self._saved.add(number)
        run.checkpoints.append(number)
        if failure is not None:
            failure.add_note(f"fit saved the checkpoint of step {number} first")
            raise failure


def _finish_saves(checkpointer: Any, failure: BaseException | None) -> None:
    """Wait for the checkpointer's save in flight; its error is raised, or noted on ``failure``.

    A signal that interrupts the wait (Ctrl-C, SIGTERM raised as an exception) does not cut
    the save short: the wait goes on, then the interruption is raised.
    """
    wait = getattr(checkpointer, "wait", None)
    if wait is None:
        return
    interrupted: BaseException | None = None
    while True:
        try:
            wait()
            break
        except (KeyboardInterrupt, SystemExit) as err:  # the save completes first
            interrupted = interrupted or err
        except Exception as err:
            first = failure or interrupted
            if first is None:
                raise
            first.add_note(f"and the checkpoint save in flight failed: {err}")
            break
    if interrupted is not None:
        raise interrupted


class MetricLogging(Callback):
    """Write every ``every``-th step's scalar metrics to ``writers`` at its step number.

    Steps are counted across resumed runs. A step's metrics are read from the device one due
    step late (when the next one is due, before a checkpoint, or at the end), so logging does
    not stall the device. The writers are flushed before each checkpoint (a resumed run never
    misses a logged step) and at the end, and left open. A writer belongs to one
    ``MetricLogging``: `fit` refuses one given to two (it would write steps twice).

    Args:
        writers: `jaxwise.metrics` writers (``write(step, scalars)``, ``flush()``).
        every: write every this many steps.

    Raises:
        TypeError: ``writers`` is not a list of writers.
        ValueError: ``every`` < 1; a writer given twice.

    Examples:
        >>> class Print:
        ...     def write(self, step, scalars): print(step, scalars)
        ...     def flush(self): pass
        >>> len(MetricLogging([Print()], every=10).writers)
        1
    """

    def __init__(self, writers: Sequence[Writer], every: int = 1) -> None:
        if not isinstance(writers, (list, tuple)):
            raise TypeError(
                f"`writers` must be a list of metric writers, got {type(writers).__name__}"
            )
        for i, w in enumerate(writers):
            if isinstance(w, type) or not (
                callable(getattr(w, "write", None)) and callable(getattr(w, "flush", None))
            ):
                raise TypeError(
                    f"`writers[{i}]` must be a jaxwise.metrics.MetricWriter instance (write, "
                    f"flush, close), got {w.__name__ if isinstance(w, type) else type(w).__name__}"
                )
        for i, w in enumerate(writers):
            j = next(j for j, other in enumerate(writers) if other is w)
            if j != i:
                raise ValueError(
                    f"`writers[{i}]` is `writers[{j}]` ({type(w).__name__}): it would write every "
                    "step twice; give each writer once"
                )
        self.writers: tuple[Writer, ...] = tuple(writers)
        self.every: int | None = check_int(every, "every", min_value=1)
        self._pending: tuple[int, Mapping[str, float]] | None = None

    def __repr__(self) -> str:
        names = ", ".join(type(w).__name__ for w in self.writers)
        return f"MetricLogging([{names}], every={self.every})"

    def on_start(self, run: FitRun) -> None:
        """Refuse a writer of another `MetricLogging` of the run; flush before each save.

        Args:
            run: the run.

        Raises:
            ValueError: a writer is also another `MetricLogging`'s.
        """
        groups = [c for c in run.callbacks if isinstance(c, MetricLogging)]
        mine = groups.index(self)
        for other in groups[:mine]:
            for w in self.writers:
                if any(w is o for o in other.writers):
                    raise ValueError(
                        f"the metric writer {type(w).__name__} is in two MetricLogging "
                        f"(every={other.every} and every={self.every}): it would write the "
                        "steps both are due at twice; give each writer to one MetricLogging"
                    )
        self._pending = None
        run.before_save(self.flush)

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> None:
        """Write the previous due step's metrics; keep this one's (read later).

        Args:
            step: the number of the batch just trained.
            state: not used.
            metrics: its scalar metrics.
        """
        del state
        self._write_pending()  # the previous due step's: read now, this step is queued
        self._pending = (step, metrics)

    def on_end(self, step: int, state: TrainState | None) -> None:
        """Write the last due step (unless `fit` is failing) and flush the writers.

        Args:
            step: the number of the last batch trained.
            state: the final state (None: `fit` is failing; nothing more is read).
        """
        del step
        if state is None:  # failing: what is written is flushed, nothing more is read
            self._pending = None
        self.flush()

    def flush(self) -> None:
        """Write the pending step, then flush every writer (an error names the writer)."""
        self._write_pending()
        for w in self.writers:
            try:
                w.flush()
            except Exception as err:
                err.add_note(f"raised by the metric writer {type(w).__name__}'s flush()")
                raise

    def _write_pending(self) -> None:
        if self._pending is None:
            return
        step, metrics = self._pending
        self._pending = None
        values = dict(metrics)
        for w in self.writers:
            w.write(step, values)


class ProgressBar(Callback):
    """A progress bar on stderr with the loss and the skipped-step count (needs rich, ``cli``).

    A step is shown when the next one is queued (its metrics are read then), the last one at
    the end.

    Examples:
        >>> ProgressBar()
        ProgressBar()
    """

    every = 1

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None
        self._advance: Callable[..., None] = lambda **_: None
        self._pending: Mapping[str, float] | None = None
        self._skipped = 0

    def __repr__(self) -> str:
        return "ProgressBar()"

    def on_start(self, run: FitRun) -> None:
        """Draw the bar (of ``run.total`` steps).

        Args:
            run: the run.

        Raises:
            ImportError: rich is not installed (one line naming the ``cli`` extra).
        """
        bar = progress_bar(
            True,
            run.total,
            "train",
            "loss {loss:.4g}  skipped {skipped}",
            feature="jaxwise.train.ProgressBar",
            loss=float("nan"),
            skipped=0,
        )
        self._stack = contextlib.ExitStack()
        self._advance = self._stack.enter_context(bar)
        self._pending, self._skipped = None, 0

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> None:
        """Show the previous step (its metrics are read now); keep this one's.

        Args:
            step: the number of the batch just trained.
            state: not used.
            metrics: its scalar metrics.
        """
        del step, state
        self._show()
        self._pending = metrics

    def on_end(self, step: int, state: TrainState | None) -> None:
        """Show the last step (unless `fit` is failing) and close the bar.

        Args:
            step: the number of the last batch trained.
            state: the final state (None: `fit` is failing).
        """
        del step
        try:
            if state is not None:
                self._show()
        finally:
            self._pending = None
            if self._stack is not None:
                self._stack.close()
                self._stack = None

    def _show(self) -> None:
        if self._pending is None:
            return
        metrics, self._pending = self._pending, None
        self._skipped += int(metrics.get("skipped", 0))
        self._advance(loss=metrics.get("loss", float("nan")), skipped=self._skipped)


class EarlyStopping(Callback):
    """Stop `fit` when ``monitor`` has not improved for ``patience`` due steps.

    An improvement is a finite value below the best by more than ``min_delta`` (above, with
    ``mode="max"``). The best value, its step and the count of due steps without improvement
    are its state: saved in each checkpoint, restored by ``fit(..., resume=...)``. Keras'
    ``EarlyStopping``, without restoring weights (keep the best with a checkpoint of your own
    in a subclass's ``on_step``: ``best_step == step`` says the step improved).

    Args:
        monitor: the metric watched (a key of the step's scalar metrics).
        patience: due steps without improvement before stopping.
        min_delta: the least change that counts as an improvement.
        mode: ``"min"`` (lower is better) or ``"max"``.
        every: look every this many steps (each look reads the metrics of that step).

    Raises:
        TypeError: ``monitor`` is not a string, ``min_delta`` not a number.
        ValueError: ``patience`` or ``every`` < 1, ``min_delta`` < 0, another ``mode``; at a
            step whose metrics have no ``monitor``.

    Examples:
        >>> stop = EarlyStopping("loss", patience=2)
        >>> [stop.on_step(s, None, {"loss": v}) for s, v in enumerate([3.0, 2.0, 2.5, 2.1], 1)]
        [False, False, False, True]
        >>> stop.state_dict()
        {'best': 2.0, 'best_step': 2, 'bad': 2, 'stopped': True}
    """

    def __init__(
        self,
        monitor: str = "loss",
        *,
        patience: int,
        min_delta: float = 0.0,
        mode: str = "min",
        every: int = 1,
    ) -> None:
        if not isinstance(monitor, str) or not monitor:
            raise TypeError(f"`monitor` must be a metric's name, got {monitor!r}")
        if isinstance(min_delta, bool) or not isinstance(min_delta, (int, float)):
            raise TypeError(f"`min_delta` must be a number, got {type(min_delta).__name__}")
        if not math.isfinite(min_delta) or min_delta < 0:
            raise ValueError(f"`min_delta` must be finite and >= 0, got {min_delta}")
        if mode not in ("min", "max"):
            raise ValueError(f"`mode` must be 'min' or 'max', got {mode!r}")
        self.monitor, self.mode, self.min_delta = monitor, mode, float(min_delta)
        self.patience = check_int(patience, "patience", min_value=1)
        self.every = check_int(every, "every", min_value=1)
        self.best: float | None = None
        self.best_step: int | None = None
        self.bad = 0
        self.stopped = False

    def __repr__(self) -> str:
        return (
            f"EarlyStopping({self.monitor!r}, patience={self.patience}, "
            f"min_delta={self.min_delta}, mode={self.mode!r}, every={self.every})"
        )

    def on_start(self, run: FitRun) -> None:
        """Start afresh (a resumed run's state is loaded after this).

        Args:
            run: not used.
        """
        del run
        self.best, self.best_step, self.bad, self.stopped = None, None, 0, False

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> bool:
        """Compare ``metrics[monitor]`` with the best so far.

        Args:
            step: the number of the batch just trained.
            state: not used.
            metrics: its scalar metrics (read now).

        Returns:
            True (stop) after ``patience`` due steps without an improvement.

        Raises:
            ValueError: ``metrics`` has no ``monitor``.
        """
        del state
        if self.monitor not in metrics:
            raise ValueError(
                f"EarlyStopping: the metrics of step {step} have no {self.monitor!r} "
                f"(they have {sorted(metrics)}); pass `monitor=` one of them"
            )
        value = float(metrics[self.monitor])
        if self._improves(value):
            self.best, self.best_step, self.bad = value, step, 0
            return False
        self.bad += 1
        self.stopped = self.bad >= self.patience
        return self.stopped

    def _improves(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        if self.best is None:
            return True
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def state_dict(self) -> dict[str, Any]:
        """The state a checkpoint saves.

        Returns:
            The best value, its step, the due steps since, and whether it stopped.
        """
        return {
            "best": self.best,
            "best_step": self.best_step,
            "bad": self.bad,
            "stopped": self.stopped,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue from a saved ``state_dict()``.

        Args:
            state: what ``state_dict`` returned.

        Raises:
            ValueError: ``state`` is not one ``state_dict`` returned.
        """
        fields = ("best", "best_step", "bad", "stopped")
        values: list[Any] = [state.get(k) for k in fields] if isinstance(state, Mapping) else []
        ok = len(values) == 4 and all(k in state for k in fields)
        best, best_step, bad, stopped = values if ok else (None, None, 0, False)
        ok = (
            ok
            and (best is None or (isinstance(best, (int, float)) and not isinstance(best, bool)))
            and (best_step is None or is_int(best_step))
            and is_int(bad)
            and isinstance(stopped, bool)
        )
        if not ok:
            raise ValueError(
                f"EarlyStopping: the saved state {str(state)[:120]} is not one its "
                "state_dict() returned"
            )
        self.best = None if best is None else float(best)
        self.best_step = None if best_step is None else int(best_step)
        self.bad, self.stopped = int(bad), bool(stopped)

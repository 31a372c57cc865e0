"""A streaming training loop: host batches in, device kept busy, NaN-guard counts, checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any, Protocol, runtime_checkable

import jax
import numpy as np

from jaxwise._checks import check_callable, check_int
from jaxwise._interrupt import sigterm_raises
from jaxwise._prefetch import prefetch_to_device
from jaxwise._progress import progress_bar
from jaxwise.train._data_state import DataPosition, StatefulIterator
from jaxwise.train._state import TrainState

__all__ = ["FitCallback", "FitReport", "StatefulIterator", "Terminated", "fit"]


class _Writer(Protocol):
    """A `jaxwise.metrics.MetricWriter` (structural: ``train`` does not import ``metrics``)."""

    def write(self, step: int, scalars: Mapping[str, float]) -> None: ...

    def flush(self) -> None: ...


class _Saver(Protocol):
    """What `fit` saves checkpoints with: a `jaxwise.checkpoint.Checkpointer`.

    A structural type, so that ``train`` does not import ``checkpoint`` (the layer above it).
    An optional ``wait()`` finishes an asynchronous save in flight (raising its error).
    """

    def save(self, tree: TrainState, metadata: dict[str, Any] | None = None) -> Any: ...


@runtime_checkable
class FitCallback(Protocol):
    """What `fit` calls after each batch: early stopping, validation, a progress display, ….

    Called with the state the batch produced, the batch's number (counted across resumed
    runs, as the writers see it) and its scalar metrics as floats; returning True stops
    ``fit`` after that batch (it saves a checkpoint then, as at the end of the data).

    Examples:
        >>> def stop_below(state, batch, scalars):
        ...     return scalars["loss"] < 1e-3
        >>> isinstance(stop_below, FitCallback)
        True
    """

    def __call__(
        self, state: TrainState, batch: int, scalars: Mapping[str, float]
    ) -> bool | None: ...


class Terminated(SystemExit):
    """SIGTERM arrived during `fit`: the save in flight was finished, then this is raised.

    A ``SystemExit`` with code 143 (128 + SIGTERM), so an uncaught one ends the program as
    the signal would have, after the checkpoint is complete.
    """

    __module__ = "jaxwise.train"

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


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


@dataclasses.dataclass(frozen=True)
class FitReport:
    """What `fit` did.

    Attributes:
        steps: batches trained on in this call.
        skipped: steps the NaN guard skipped (non-finite loss or gradients; state unchanged).
        losses: float64 ``(steps,)``: the loss of every step, in order (NaN for a step whose
            gradient reports no loss, e.g. a DP gradient).
        checkpoints: the step numbers saved, in order.
        seconds: wall-clock time of the loop.
    """

    steps: int
    skipped: int
    losses: np.ndarray
    checkpoints: tuple[int, ...]
    seconds: float


def _check(state: Any, steps: Any, checkpointer: Any, checkpoint_every: Any, prefetch: Any) -> None:
    if not isinstance(state, TrainState):
        raise TypeError(f"`state` must be a TrainState, got {type(state).__name__}")
    if steps is not None:
        check_int(steps, "steps", min_value=1)
    if checkpoint_every is not None:
        check_int(checkpoint_every, "checkpoint_every", min_value=1)
        if checkpointer is None:
            raise ValueError("`checkpoint_every` needs `checkpointer`")
    if checkpointer is not None and not callable(getattr(checkpointer, "save", None)):
        raise TypeError(
            "`checkpointer` must be a jaxwise.checkpoint.Checkpointer (an object with "
            f"`save(state, metadata)`), got {type(checkpointer).__name__}"
        )
    check_int(prefetch, "prefetch", min_value=0)


def _check_all(
    step: Any, state: Any, batches: Any, saving: tuple[Any, Any, Any], rest: tuple[Any, ...]
) -> tuple[tuple[_Writer, ...], tuple[FitCallback, ...]]:
    """`fit`'s arguments checked: the writers and callbacks, as tuples."""
    prefetch, writers, log_every, callbacks = rest
    check_callable(step, "step")
    _check(state, *saving, prefetch)
    if not isinstance(batches, Iterable):
        raise TypeError(f"`batches` must be an iterable of batches, got {type(batches).__name__}")
    return _check_writers(writers, log_every), _check_callbacks(callbacks)


def _check_writers(writers: Any, log_every: Any) -> tuple[_Writer, ...]:
    if not isinstance(writers, (list, tuple)):
        raise TypeError(f"`writers` must be a list of metric writers, got {type(writers).__name__}")
    for i, w in enumerate(writers):
        if not (callable(getattr(w, "write", None)) and callable(getattr(w, "flush", None))):
            raise TypeError(
                f"`writers[{i}]` must be a jaxwise.metrics.MetricWriter (write, flush, close), "
                f"got {type(w).__name__}"
            )
    check_int(log_every, "log_every", min_value=1)
    return tuple(writers)


def _check_callbacks(callbacks: Any) -> tuple[FitCallback, ...]:
    if not isinstance(callbacks, (list, tuple)):
        raise TypeError(f"`callbacks` must be a list of callables, got {type(callbacks).__name__}")
    for i, callback in enumerate(callbacks):
        if not callable(callback):
            raise TypeError(
                f"`callbacks[{i}]` must be callable as callback(state, batch, scalars), "
                f"got {type(callback).__name__}"
            )
    return tuple(callbacks)


_NUMBERS = (jax.Array, np.ndarray, np.generic, int, float)


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The 0-d numeric entries of a step's metrics, as floats (one transfer for all)."""
    chosen = {
        k: v
        for k, v in metrics.items()  # a has_aux dict (or None) is not a scalar metric
        if isinstance(k, str) and isinstance(v, _NUMBERS) and np.ndim(v) == 0
    }
    return {k: float(v) for k, v in jax.device_get(chosen).items()}


def _loss_and_skipped(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: metrics[k] for k in ("loss", "skipped") if k in metrics}


class _Log:
    """The loop's record: losses, skipped steps, the progress bar and the metric writers."""

    def __init__(
        self, writers: tuple[_Writer, ...], log_every: int, first: int, advance: Any
    ) -> None:
        self.writers, self.log_every, self.first, self.advance = writers, log_every, first, advance
        self.losses: list[float] = []
        self.skipped = 0

    @property
    def batch(self) -> int:
        """The number of the last batch recorded, counted over resumed runs."""
        return self.first + len(self.losses)

    def record(self, metrics: dict[str, Any], scalars: dict[str, float] | None = None) -> None:
        """Record one step's metrics (``scalars``: already read from them, or None).

        One transfer from the device per step: the scalars a writer needs, or the loss and
        the skipped count.
        """
        batch = self.batch + 1
        due = bool(self.writers) and batch % self.log_every == 0
        if scalars is None:
            scalars = _scalars(metrics if due else _loss_and_skipped(metrics))
        self.losses.append(float(scalars.get("loss", np.nan)))  # a DP gradient has none
        self.skipped += int(scalars.get("skipped", 0))
        self.advance(loss=self.losses[-1], skipped=self.skipped)
        if due:
            for w in self.writers:
                w.write(batch, scalars)

    def flush(self) -> None:
        for w in self.writers:
            try:
                w.flush()
            except Exception as err:
                err.add_note(f"raised by the metric writer {type(w).__name__}'s flush()")
                raise


class _Loop:
    """One `fit` call: steps, the deferred read of metrics, callbacks and checkpoints."""

    def __init__(
        self,
        step: Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]],
        log: _Log,
        position: DataPosition,
        saving: tuple[_Saver | None, int | None, dict[str, Any] | None],
        callbacks: tuple[FitCallback, ...],
    ) -> None:
        self.step, self.log, self.position, self.callbacks = step, log, position, callbacks
        self.checkpointer, self.every, self.metadata = saving
        self.saved: list[int] = []

    def run(self, state: TrainState, feed: Iterable[Any]) -> TrainState:
        """Train over ``feed``; the save in flight is finished before returning or raising."""
        failure: BaseException | None = None
        try:
            return self._steps(state, feed)
        except BaseException as err:
            failure = err
            raise
        finally:
            _finish_saves(self.checkpointer, failure)
            if failure is None:
                self.log.flush()
            else:  # the first error is the one to see (a writer's flush may fail again)
                with contextlib.suppress(Exception):
                    self.log.flush()

    def _steps(self, state: TrainState, feed: Iterable[Any]) -> TrainState:
        pending, done = None, 0
        for batch in feed:
            state, metrics = self.step(state, batch)
            self.position.consumed()
            done += 1
            if pending is not None:
                self.log.record(pending)  # the previous step's metrics: this step is queued
            pending = metrics
            due = bool(self.every) and done % self.every == 0  # type: ignore[operator]
            if self.callbacks or due:  # read now: the callbacks see this step's state
                stop = self._call_back(state, pending)
                pending = None
                if due:
                    self._checkpoint(state)
                if stop:
                    break
        if pending is not None:
            self.log.record(pending)
        if self.log.losses:
            self._checkpoint(state)
        return state

    def _call_back(self, state: TrainState, metrics: dict[str, Any]) -> bool:
        """Record ``metrics``; then the callbacks, in order: True when one asks to stop."""
        scalars = _scalars(metrics) if self.callbacks else None
        self.log.record(metrics, scalars)
        stop = False
        for callback in self.callbacks:
            stop = bool(callback(state, self.log.batch, dict(scalars or {}))) or stop
        return stop

    def report(self, seconds: float) -> FitReport:
        losses = np.asarray(self.log.losses, np.float64)
        return FitReport(len(losses), self.log.skipped, losses, tuple(self.saved), seconds)

    def _checkpoint(self, state: TrainState) -> None:
        try:
            self.log.flush()  # the writers hold every step a checkpoint holds
        except Exception as err:  # a writer's failure never costs the checkpoint: save, then
            if self._save(state):  # report the writer's error
                err.add_note(f"fit saved the checkpoint of step {int(state.step)} first")
            raise
        self._save(state)

    def _save(self, state: TrainState) -> bool:
        """Save ``state`` unless it is saved already (or there is no checkpointer)."""
        if self.checkpointer is not None and int(state.step) not in self.saved:  # else: nothing
            metadata = {**(self.metadata or {}), "fit": self.position.saved(self.log.batch)}
            self.checkpointer.save(state, metadata)
            self.saved.append(int(state.step))
            return True
        return False


def fit(
    step: Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]],
    state: TrainState,
    batches: Iterable[Any],
    *,
    steps: int | None = None,
    checkpointer: _Saver | None = None,
    checkpoint_every: int | None = None,
    metadata: dict[str, Any] | None = None,
    prefetch: int = 2,
    progress: bool = False,
    writers: Sequence[_Writer] = (),
    log_every: int = 1,
    resume_from: Mapping[str, Any] | None = None,
    callbacks: Sequence[FitCallback] = (),
) -> tuple[TrainState, FitReport]:
    """Train ``step`` over an iterator of host batches, keeping the device busy.

    Batches are transferred ``prefetch`` ahead by
    [`prefetch_to_device`][jaxwise.data.prefetch_to_device] (over ``step.mesh``'s ``"data"``
    axis when it has one); a step's metrics are read after the next step is dispatched. With
    a ``checkpointer`` the state is saved (asynchronously, at most one save in flight) every
    ``checkpoint_every`` steps and at the end, with ``metadata`` as it is at that save plus
    ``"fit"`` (the batch count, a `StatefulIterator`'s position: pass it back as ``resume_from``
    to continue exactly). Writers are flushed before each save (a failed flush: saved first,
    then raised); the save in flight is finished on return, on any exception and on SIGTERM
    (default handler: then `Terminated` is raised).

    Args:
        step: a ``step(state, batch) -> (state, metrics)`` whose metrics have ``"loss"``
            (and ``"skipped"``), e.g. [`make_train_step`][jaxwise.train.make_train_step].
        state: the initial state (donated to the first step, as with ``step``).
        batches: an iterable of batches (pytrees of host arrays); in a multi-process job,
            each process's own rows.
        steps: stop after this many batches (default: when ``batches`` ends).
        checkpointer: a `jaxwise.checkpoint.Checkpointer` (left open), or ``None``.
        checkpoint_every: save every this many steps (and at the end); needs ``checkpointer``.
        metadata: JSON metadata of every checkpoint, read at each save.
        prefetch: batches kept ready on the devices (0: transfer in the loop).
        progress: show a progress bar on stderr (needs rich, the ``cli`` extra).
        writers: `jaxwise.metrics` writers, each ``log_every``-th batch's scalar metrics
            written at its batch number (counted across resumed runs); flushed, left open.
        log_every: write every this many batches.
        resume_from: the metadata of the checkpoint ``state`` was restored from (a list
            skips the batches trained, grain is restored, a plain iterator is the caller's).
        callbacks: each called after every batch as ``callback(state, batch, scalars)``
            with the state that batch produced (the loop waits for it); one returning True
            stops the loop after that batch (saved, as at the end).

    Returns:
        ``(state, report)``: the final state and a [`FitReport`][jaxwise.train.FitReport].

    Raises:
        TypeError: an argument is not of its type (a writer without ``write``, …).
        ValueError: a count is out of range, ``checkpoint_every`` without a
            ``checkpointer``, or ``resume_from``'s data position does not fit ``batches``.

    Examples:
        >>> import jax.numpy as jnp, numpy as np; from jaxwise import optim
        >>> from jaxwise.train import TrainState, make_train_step
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> x = np.random.default_rng(0).normal(size=(16, 3)).astype(np.float32)
        >>> data = [(x, x @ np.asarray([1.0, -2.0, 0.5], np.float32))] * 200
        >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.adam(0.1), 0)
        >>> state, report = fit(make_train_step(loss), state, data)
        >>> report.steps, report.skipped, bool(report.losses[-1] < 1e-3)
        (200, 0, True)
    """
    outs, hooks = _check_all(step, state, batches, (steps, checkpointer, checkpoint_every),
                             (prefetch, writers, log_every, callbacks))  # fmt: skip
    total = steps if steps is not None else (len(batches) if isinstance(batches, Sized) else None)
    position = DataPosition.start(batches, resume_from, int(state.step))
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_raises(Terminated, only_default=True))
        feed = _feed(stack, position.source, steps, prefetch, getattr(step, "mesh", None))
        log = _Log(outs, log_every, position.first, stack.enter_context(_bar(progress, total)))
        loop = _Loop(step, log, position, (checkpointer, checkpoint_every, metadata), hooks)
        state = loop.run(state, feed)
    return state, loop.report(time.perf_counter() - started)


def _feed(
    stack: contextlib.ExitStack, source: Iterable[Any], steps: int | None, prefetch: int, mesh: Any
) -> Iterable[Any]:
    """The batches the loop trains on: at most ``steps``, prefetched to the devices."""
    if steps is not None:
        source = itertools.islice(source, steps)
    return stack.enter_context(prefetch_to_device(source, prefetch, mesh)) if prefetch else source


def _bar(progress: Any, total: int | None) -> Any:
    return progress_bar(
        bool(progress),
        total,
        "train",
        "loss {loss:.4g}  skipped {skipped}",
        feature="jaxwise.train.fit(progress=True)",
        loss=float("nan"),
        skipped=0,
    )

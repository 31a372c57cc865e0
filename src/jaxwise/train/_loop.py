"""A streaming training loop: host batches in, device kept busy, NaN-guard counts, checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import signal
import time
from collections.abc import Callable, Iterable, Sequence, Sized
from typing import Any

import jax
import numpy as np

from jaxwise._checks import check_callable, check_int
from jaxwise._interrupt import sigterm_raises
from jaxwise._prefetch import prefetch_to_device
from jaxwise._progress import progress_bar
from jaxwise.train._callbacks import (
    Checkpointing,
    FitCallback,
    MetricLogging,
    Plan,
    ProgressBar,
    Resume,
    plan,
)
from jaxwise.train._data_state import DataPosition, ResumeError, ResumeWarning, StatefulIterator
from jaxwise.train._state import TrainState

__all__ = [
    "Checkpointing",
    "FitCallback",
    "FitReport",
    "MetricLogging",
    "ProgressBar",
    "Resume",
    "ResumeError",
    "ResumeWarning",
    "StatefulIterator",
    "Terminated",
    "fit",
]


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


def _check(program: Any, state: Any, batches: Any, steps: Any, prefetch: Any) -> None:
    check_callable(program, "program")
    if not isinstance(state, TrainState):
        raise TypeError(f"`state` must be a TrainState, got {type(state).__name__}")
    if not isinstance(batches, Iterable):
        raise TypeError(f"`batches` must be an iterable of batches, got {type(batches).__name__}")
    if steps is not None:
        check_int(steps, "steps", min_value=1)
    check_int(prefetch, "prefetch", min_value=0)


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

    def __init__(self, logging: tuple[MetricLogging, ...], first: int, advance: Any) -> None:
        self.logging, self.first, self.advance = logging, first, advance
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
        due = [group for group in self.logging if batch % group.every == 0]
        if scalars is None:
            scalars = _scalars(metrics if due else _loss_and_skipped(metrics))
        self.losses.append(float(scalars.get("loss", np.nan)))  # a DP gradient has none
        self.skipped += int(scalars.get("skipped", 0))
        self.advance(loss=self.losses[-1], skipped=self.skipped)
        for group in due:
            for w in group.writers:
                w.write(batch, scalars)

    def flush(self) -> None:
        for group in self.logging:
            for w in group.writers:
                try:
                    w.flush()
                except Exception as err:
                    err.add_note(f"raised by the metric writer {type(w).__name__}'s flush()")
                    raise


class _Loop:
    """One `fit` call: steps, the deferred read of metrics, callbacks and checkpoints."""

    def __init__(
        self,
        program: Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]],
        log: _Log,
        position: DataPosition,
        plan: Plan,
    ) -> None:
        self.program, self.log, self.position = program, log, position
        self.callbacks = plan.functions
        self.saving = plan.checkpointing
        self.every = self.saving.every if self.saving is not None else None
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
            if self.saving is not None:
                _finish_saves(self.saving.checkpointer, failure)
            if failure is None:
                self.log.flush()
            else:  # the first error is the one to see (a writer's flush may fail again)
                with contextlib.suppress(Exception):
                    self.log.flush()

    def _steps(self, state: TrainState, feed: Iterable[Any]) -> TrainState:
        pending, done = None, 0
        for batch in feed:
            state, metrics = self.program(state, batch)
            self.position.consumed()
            done += 1
            if pending is not None:
                self.log.record(pending)  # the previous step's metrics: this step is queued
            pending = metrics
            due = self.every is not None and done % self.every == 0
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
        """Save ``state`` unless it is saved already (or there is no checkpointing)."""
        if self.saving is not None and int(state.step) not in self.saved:  # else: nothing
            record = self.position.saved(self.log.batch)
            self.saving.checkpointer.save(state, {**(self.saving.metadata or {}), "fit": record})
            self.saved.append(int(state.step))
            return True
        return False


def fit(
    program: Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]],
    state: TrainState,
    batches: Iterable[Any],
    *,
    steps: int | None = None,
    prefetch: int = 2,
    callbacks: Sequence[FitCallback | Checkpointing | MetricLogging | ProgressBar | Resume] = (),
) -> tuple[TrainState, FitReport]:
    """Train ``program`` over an iterator of host batches, keeping the device busy.

    Batches are transferred ``prefetch`` ahead by
    [`prefetch_to_device`][jaxwise.data.prefetch_to_device] (over ``program.mesh``'s ``"data"``
    axis when it has one); a step's metrics are read after the next step is dispatched.
    Everything else is a callback: [`Checkpointing`][jaxwise.train.Checkpointing] (saves, at
    most one in flight, finished on return, on any exception and on SIGTERM: then `Terminated`
    is raised), [`MetricLogging`][jaxwise.train.MetricLogging] (writers),
    [`ProgressBar`][jaxwise.train.ProgressBar], [`Resume`][jaxwise.train.Resume] (continue a
    checkpointed run exactly) and plain [`FitCallback`][jaxwise.train.FitCallback] functions.

    Args:
        program: a ``program(state, batch) -> (state, metrics)`` whose metrics have ``"loss"``
            (and ``"skipped"``), e.g. [`make_step`][jaxwise.train.make_step]'s.
        state: the initial state (donated to the first step, as with ``program``).
        batches: an iterable of batches (pytrees of host arrays); in a multi-process job,
            each process's own rows.
        steps: stop after this many batches (default: when ``batches`` ends).
        prefetch: batches kept ready on the devices (0: transfer in the loop).
        callbacks: the loop's plug-ins, in a list: functions called after every batch as
            ``callback(state, batch, scalars)`` (one returning True stops the loop after that
            batch, saved as at the end), and at most one `Checkpointing`, `ProgressBar` and
            `Resume`, any number of `MetricLogging`.

    Returns:
        ``(state, report)``: the final state and a [`FitReport`][jaxwise.train.FitReport].

    Raises:
        TypeError: an argument is not of its type (a callback neither callable nor one of
            the objects, …).
        ValueError: a count is out of range, or two objects of a role that takes one.
        ResumeError: `Resume`'s data position or fingerprint does not fit ``batches``.

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
    _check(program, state, batches, steps, prefetch)
    roles = plan(callbacks)
    total = steps if steps is not None else (len(batches) if isinstance(batches, Sized) else None)
    saving = roles.checkpointing is not None
    position = DataPosition.start(batches, roles.resume, int(state.step), saving)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_raises(Terminated, only_default=True))
        feed = _feed(stack, position.source, steps, prefetch, getattr(program, "mesh", None))
        advance = stack.enter_context(_bar(roles.progress, total))
        loop = _Loop(program, _Log(roles.logging, position.first, advance), position, roles)
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
        feature="jaxwise.train.ProgressBar",
        loss=float("nan"),
        skipped=0,
    )

"""A streaming training loop: host batches in, device kept busy, NaN-guard counts, checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import signal
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any

import numpy as np

from jaxwise._shared._checks import check_callable, check_int
from jaxwise._shared._interrupt import sigterm_raises
from jaxwise._shared._prefetch import prefetch_to_device
from jaxwise.train._loop._callbacks import (
    Callback,
    FitRun,
    LambdaCallback,
    Resume,
    StepMetrics,
    as_resume,
    check_answer,
    check_callbacks,
)
from jaxwise.train._loop._data_state import (
    DataPosition,
    ResumeError,
    ResumeWarning,
    StatefulIterator,
)
from jaxwise.train._loop._standard_callbacks import (
    Checkpointing,
    EarlyStopping,
    MetricLogging,
    ProgressBar,
)
from jaxwise.train._program._state import TrainState

__all__ = [
    "Callback",
    "Checkpointing",
    "EarlyStopping",
    "FitReport",
    "FitRun",
    "LambdaCallback",
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


class _Loop:
    """One `fit` call: the steps, the callbacks due at each, the loss of every step."""

    def __init__(
        self,
        program: Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]],
        run: FitRun,
        position: DataPosition,
    ) -> None:
        self.program, self.run, self.position = program, run, position
        self.callbacks = run.callbacks
        self.step = run.first
        self.losses: list[float] = []
        self.skipped = 0
        self.last: StepMetrics | None = None

    def train(self, state: TrainState, feed: Iterable[Any], resume: Resume | None) -> TrainState:
        """Train over ``feed``; every started callback's ``on_end`` runs, whatever happens."""
        started: list[Any] = []
        try:
            for callback in self.callbacks:
                callback.on_start(self.run)
                started.append(callback)
            if resume is not None:
                self.run.load(resume.record)
            state = self._steps(state, feed)
        except BaseException as err:
            self._end(started, None, err)
            raise
        self._end(started, state, None)
        if self.last is not None:
            self._record(self.last)
        return state

    def _steps(self, state: TrainState, feed: Iterable[Any]) -> TrainState:
        pending: StepMetrics | None = None
        for batch in feed:
            state, raw = self.program(state, batch)
            self.position.consumed()
            self.step += 1
            metrics = StepMetrics(raw)
            stop = self._call_back(state, metrics)  # a writer reads the previous step's now
            if pending is not None:
                self._record(pending)  # its loss (read already, or now): this step is queued
            pending = metrics
            if stop:
                break
        self.last = pending  # recorded after on_end (a writer reads it there first)
        return state

    def _record(self, metrics: StepMetrics) -> None:
        loss, skipped = metrics.loss_and_skipped()
        self.losses.append(loss)  # a DP gradient has none: NaN
        self.skipped += skipped

    def _call_back(self, state: TrainState, metrics: StepMetrics) -> bool:
        """The callbacks due at this step, in order: True when one asks to stop."""
        stop = False
        for i, callback in enumerate(self.callbacks):
            every = callback.every
            if every is not None and self.step % every == 0:
                answer = callback.on_step(self.step, state, metrics)
                stop = check_answer(answer, i, callback, self.step) or stop
        return stop

    def _end(
        self, started: list[Any], state: TrainState | None, failure: BaseException | None
    ) -> None:
        """Every started callback's ``on_end``, each one; the first error is raised (unless
        ``failure``, the error `fit` is ending by, is: then it carries the others as notes)."""
        first = failure
        for callback in started:
            try:
                callback.on_end(self.step, state)
            except BaseException as err:
                if first is None:
                    first = err
                elif err is not first:
                    first.add_note(
                        f"and {type(callback).__name__}.on_end failed: {type(err).__name__}: {err}"
                    )
        if failure is None and first is not None:
            raise first

    def report(self, seconds: float) -> FitReport:
        losses = np.asarray(self.losses, np.float64)
        return FitReport(len(losses), self.skipped, losses, tuple(self.run.checkpoints), seconds)


def _order(callbacks: tuple[Any, ...]) -> tuple[tuple[Any, ...], bool]:
    """The callbacks with `Checkpointing` last (it saves what the others did at that step).

    Returns:
        ``(callbacks, saving)``; ``saving``: one is a `Checkpointing`.

    Raises:
        ValueError: two `Checkpointing`.
    """
    saving = [isinstance(callback, Checkpointing) for callback in callbacks]  # the one isinstance
    if sum(saving) > 1:
        raise ValueError(
            f"`callbacks[{[i for i, s in enumerate(saving) if s][1]}]` is a second "
            "Checkpointing: give at most one"
        )
    first = tuple(c for c, s in zip(callbacks, saving, strict=True) if not s)
    return first + tuple(c for c, s in zip(callbacks, saving, strict=True) if s), any(saving)


def fit(
    program: Callable[[TrainState, Any], tuple[TrainState, dict[str, Any]]],
    state: TrainState,
    batches: Iterable[Any],
    *,
    steps: int | None = None,
    prefetch: int = 2,
    resume: Resume | Mapping[str, Any] | None = None,
    callbacks: Sequence[Callback] = (),
) -> tuple[TrainState, FitReport]:
    """Train ``program`` over an iterator of host batches, keeping the device busy.

    Batches are transferred ``prefetch`` ahead by
    [`prefetch_to_device`][jaxwise.data.prefetch_to_device] (over ``program.mesh``'s ``"data"``
    axis when it has one); a step's loss is read after the next step is dispatched.
    Everything else is a [`Callback`][jaxwise.train.Callback]:
    [`Checkpointing`][jaxwise.train.Checkpointing] (saves, at most one in flight, finished on
    return, on any exception and on SIGTERM: then `Terminated` is raised),
    [`MetricLogging`][jaxwise.train.MetricLogging] (writers),
    [`ProgressBar`][jaxwise.train.ProgressBar], [`EarlyStopping`][jaxwise.train.EarlyStopping]
    and your own. A step's metrics are read from the device only when a callback due at that
    step looks at them.

    Args:
        program: a ``program(state, batch) -> (state, metrics)`` whose metrics have ``"loss"``
            (and ``"skipped"``), e.g. [`make_step`][jaxwise.train.make_step]'s.
        state: the initial state (donated to the first step, as with ``program``).
        batches: an iterable of batches (pytrees of host arrays); in a multi-process job,
            each process's own rows.
        steps: stop after this many batches (default: when ``batches`` ends).
        prefetch: batches kept ready on the devices (0: transfer in the loop).
        resume: continue a checkpointed run exactly: the checkpoint's metadata (from
            `jaxwise.checkpoint.load_metadata` of the step ``state`` was restored from) or a
            [`Resume`][jaxwise.train.Resume].
        callbacks: [`Callback`][jaxwise.train.Callback]s, called in order at each step they
            are due (a `Checkpointing` after the others); one returning True stops the loop
            after that step (it ends as at the end of the data, saved).

    Returns:
        ``(state, report)``: the final state and a [`FitReport`][jaxwise.train.FitReport].

    Raises:
        TypeError: an argument is not of its type (a callback that is not a `Callback`, an
            answer from ``on_step`` that is not a bool or None, …).
        ValueError: a count is out of range, or two `Checkpointing`.
        ResumeError: ``resume``'s step, data position or fingerprint does not fit ``state``
            and ``batches``.

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
    resumed = as_resume(resume)
    ordered, saving = _order(check_callbacks(callbacks))
    if resumed is not None:
        resumed.check_state(state)
    total = steps if steps is not None else (len(batches) if isinstance(batches, Sized) else None)
    position = DataPosition.start(batches, resumed, int(state.step), saving)
    loop = _Loop(program, FitRun(position.first, total, ordered, position), position)
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.enter_context(sigterm_raises(Terminated, only_default=True))
        feed = _feed(stack, position.source, steps, prefetch, getattr(program, "mesh", None))
        state = loop.train(state, feed, resumed)
    return state, loop.report(time.perf_counter() - started)


def _feed(
    stack: contextlib.ExitStack, source: Iterable[Any], steps: int | None, prefetch: int, mesh: Any
) -> Iterable[Any]:
    """The batches the loop trains on: at most ``steps``, prefetched to the devices."""
    if steps is not None:
        source = itertools.islice(source, steps)
    return stack.enter_context(prefetch_to_device(source, prefetch, mesh)) if prefetch else source

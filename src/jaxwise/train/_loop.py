"""A streaming training loop: host batches in, device kept busy, NaN-guard counts, checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from typing import Any, Protocol

import jax
import numpy as np

from jaxwise._checks import check_callable, check_int
from jaxwise._prefetch import prefetch_to_device
from jaxwise._progress import progress_bar
from jaxwise.train._data_state import DataPosition, StatefulIterator
from jaxwise.train._state import TrainState

__all__ = ["FitReport", "StatefulIterator", "Terminated", "fit"]


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


class Terminated(SystemExit):
    """SIGTERM arrived during `fit`: the save in flight was finished, then this is raised.

    A ``SystemExit`` with code 143 (128 + SIGTERM), so an uncaught one ends the program as
    the signal would have, after the checkpoint is complete.
    """

    __module__ = "jaxwise.train"

    def __init__(self) -> None:
        super().__init__(128 + signal.SIGTERM)


@contextlib.contextmanager
def _sigterm_raises() -> Any:
    """Within the block, SIGTERM raises `Terminated` (main thread, default handler only)."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    ):
        yield
        return

    def terminate(signum: int, frame: Any) -> None:
        del signum, frame
        raise Terminated()

    signal.signal(signal.SIGTERM, terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _finish_saves(checkpointer: Any, failure: BaseException | None) -> None:
    """Wait for the checkpointer's save in flight; its error is raised, or noted on ``failure``."""
    wait = getattr(checkpointer, "wait", None)
    if wait is None:
        return
    if failure is None:
        wait()
        return
    try:
        wait()
    except Exception as err:  # the loop's own failure comes first; the save's is noted on it
        failure.add_note(f"and the checkpoint save in flight failed: {err}")


@dataclasses.dataclass(frozen=True)
class FitReport:
    """What `fit` did.

    Attributes:
        steps: batches trained on in this call.
        skipped: steps the NaN guard skipped (non-finite loss or gradients; state unchanged).
        losses: float64 ``(steps,)``: the loss of every step, in order.
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


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    """The 0-d numeric entries of a step's metrics, as floats (one transfer for all)."""
    chosen = {k: v for k, v in metrics.items() if isinstance(k, str) and np.ndim(v) == 0}
    return {k: float(v) for k, v in jax.device_get(chosen).items()}


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

    def record(self, metrics: dict[str, Any]) -> None:
        self.losses.append(float(metrics["loss"]))
        self.skipped += int(metrics.get("skipped", 0))
        self.advance(loss=self.losses[-1], skipped=self.skipped)
        if self.writers and self.batch % self.log_every == 0:
            scalars = _scalars(metrics)
            for w in self.writers:
                w.write(self.batch, scalars)

    def flush(self) -> None:
        for w in self.writers:
            w.flush()


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
) -> tuple[TrainState, FitReport]:
    """Train ``step`` over an iterator of host batches, keeping the device busy.

    Batches are transferred by [`prefetch_to_device`][jaxwise.data.prefetch_to_device] (``prefetch``
    ahead, in a background thread, sharded over ``step.mesh``'s ``"data"`` axis when
    the step has a mesh) while the device trains on earlier ones; each step's metrics
    are read only after the next step is dispatched, so the host never waits for the
    device in between. The NaN guard's skipped steps are counted; with a
    ``checkpointer`` (a `jaxwise.checkpoint.Checkpointer`, which holds its directory's
    writer lock until you close it) the state is saved every ``checkpoint_every`` steps
    and at the end. The Checkpointer saves asynchronously (a copy of the state is written
    by a background thread while training goes on, at most one save in flight); ``fit``
    returns once the last save is complete, and on an exception (Ctrl-C included) it first
    finishes the save in flight. SIGTERM (with its default handler, in the main thread)
    stops the loop the same way and raises `Terminated`, a ``SystemExit(143)``.

    Every ``log_every``-th batch's scalar metrics (``loss``, ``skipped``, …) go to each of
    ``writers`` at its batch number (counted across resumed runs), and the writers are
    flushed before each checkpoint is saved, so a checkpoint never holds a step the writers
    lack. A stateful ``batches`` (a `StatefulIterator`: a ``grain`` DataLoader or dataset
    iterator, or anything with ``get_state``/``set_state``) has its position after each
    saved batch stored in the checkpoint's metadata (``metadata["fit"]``) beside the state;
    pass that metadata back as ``resume_from`` (with the restored state) and the run
    continues with exactly the batches an uninterrupted run would have seen.

    Args:
        step: a [`make_train_step`][jaxwise.train.make_train_step] step (or any
            ``step(state, batch) -> (state, metrics)`` whose metrics have ``"loss"`` and
            ``"skipped"``).
        state: the initial state (donated to the first step, as with ``step``).
        batches: an iterable of batches (pytrees of host arrays); in a multi-process job,
            each process's own rows.
        steps: stop after this many batches (default: when ``batches`` ends).
        checkpointer: saves the checkpoints, e.g. ``Checkpointer(directory, keep=3)``
            from `jaxwise.checkpoint` (``None``: no checkpoints). ``fit`` calls its
            ``save(state, metadata)`` and leaves it open.
        checkpoint_every: save every this many steps (and at the end); needs
            ``checkpointer``.
        metadata: JSON metadata saved with every checkpoint (``fit`` adds its key ``"fit"``).
        prefetch: batches kept ready on the devices (0: transfer in the loop).
        progress: show a progress bar on stderr (loss, skipped steps); needs rich (the
            ``cli`` extra).
        writers: `jaxwise.metrics` writers (``JsonlWriter``, ``TensorBoardWriter``,
            ``MLflowWriter``…); ``fit`` flushes them and leaves them open.
        log_every: write every this many batches.
        resume_from: the metadata of the checkpoint ``state`` was restored from
            (``checkpoint.load_metadata``): batch numbering and the data position continue
            from it.

    Returns:
        ``(state, report)``: the final state and a [`FitReport`][jaxwise.train.FitReport].

    Raises:
        TypeError: ``step`` is not callable, ``state`` is not a ``TrainState``, ``batches``
            is not iterable, ``checkpointer`` has no ``save``, a writer has no ``write``, or
            a count is not an int.
        ValueError: a count is out of range, ``checkpoint_every`` without a
            ``checkpointer``, or ``resume_from`` holds a data position that ``batches``
            cannot take (it has no ``set_state``) or lacks one that a stateful ``batches``
            needs.

    Examples:
        >>> import jax, jax.numpy as jnp, numpy as np
        >>> from jaxwise import optim
        >>> from jaxwise.train import TrainState, make_train_step
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> rng = np.random.default_rng(0)
        >>> def batches():
        ...     while True:
        ...         x = rng.normal(size=(16, 3)).astype(np.float32)
        ...         yield x, x @ np.asarray([1.0, -2.0, 0.5], np.float32)
        >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.adam(0.1), 0)
        >>> state, report = fit(make_train_step(loss), state, batches(),
        ...                     steps=200, progress=False)
        >>> report.steps, report.skipped, bool(report.losses[-1] < 1e-3)
        (200, 0, True)
    """
    check_callable(step, "step")
    _check(state, steps, checkpointer, checkpoint_every, prefetch)
    outs = _check_writers(writers, log_every)
    if not isinstance(batches, Iterable):
        raise TypeError(f"`batches` must be an iterable of batches, got {type(batches).__name__}")
    total = steps if steps is not None else (len(batches) if isinstance(batches, Sized) else None)
    position = DataPosition.start(batches, resume_from, int(state.step))
    source: Iterable[Any] = position.source
    if steps is not None:
        source = itertools.islice(source, steps)
    started = time.perf_counter()
    saved: list[int] = []
    failure: BaseException | None = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_raises())
        mesh = getattr(step, "mesh", None)
        feed = (
            stack.enter_context(prefetch_to_device(source, prefetch, mesh)) if prefetch else source
        )
        log = _Log(outs, log_every, position.first, stack.enter_context(_bar(progress, total)))

        def checkpoint() -> None:
            log.flush()  # the writers hold every step a checkpoint holds
            if checkpointer is not None and int(state.step) not in saved:  # skipped: nothing new
                checkpointer.save(state, {**(metadata or {}), "fit": position.saved(log.batch)})
                saved.append(int(state.step))

        pending = None
        try:
            for batch in feed:
                state, metrics = step(state, batch)
                position.consumed()
                if pending is not None:
                    log.record(pending)  # the previous step's metrics: this step is queued
                pending = metrics
                if checkpoint_every and (len(log.losses) + 1) % checkpoint_every == 0:
                    log.record(pending)
                    pending = None
                    checkpoint()
            if pending is not None:
                log.record(pending)
            if log.losses:
                checkpoint()
        except BaseException as err:
            failure = err
            raise
        finally:
            _finish_saves(checkpointer, failure)
            log.flush()
    seconds = time.perf_counter() - started
    losses = np.asarray(log.losses, np.float64)
    return state, FitReport(len(losses), log.skipped, losses, tuple(saved), seconds)


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

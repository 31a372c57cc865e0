"""A streaming training loop: host batches in, device kept busy, NaN-guard counts, checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sized
from typing import Any, Protocol

import numpy as np

from jaxwise._checks import check_callable, check_int
from jaxwise._prefetch import prefetch_to_device
from jaxwise._progress import progress_bar
from jaxwise.train._state import TrainState

__all__ = ["FitReport", "Terminated", "fit"]


class _Saver(Protocol):
    """What `fit` saves checkpoints with: a `jaxwise.checkpoint.Checkpointer`.

    A structural type, so that ``train`` does not import ``checkpoint`` (the layer above it).
    An optional ``wait()`` finishes an asynchronous save in flight (raising its error).
    """

    def save(self, state: TrainState, metadata: dict[str, Any] | None = None) -> Any: ...


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
        metadata: JSON metadata saved with every checkpoint.
        prefetch: batches kept ready on the devices (0: transfer in the loop).
        progress: show a progress bar on stderr (loss, skipped steps); needs rich (the
            ``cli`` extra).

    Returns:
        ``(state, report)``: the final state and a [`FitReport`][jaxwise.train.FitReport].

    Raises:
        TypeError: ``step`` is not callable, ``state`` is not a ``TrainState``, ``batches``
            is not iterable, ``checkpointer`` has no ``save``, or a count is not an int.
        ValueError: a count is out of range, or ``checkpoint_every`` without a
            ``checkpointer``.

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
    if not isinstance(batches, Iterable):
        raise TypeError(f"`batches` must be an iterable of batches, got {type(batches).__name__}")
    total = steps if steps is not None else (len(batches) if isinstance(batches, Sized) else None)
    source: Iterable[Any] = itertools.islice(batches, steps) if steps is not None else batches
    mesh = getattr(step, "mesh", None)
    started = time.perf_counter()
    losses: list[float] = []
    saved: list[int] = []
    skipped = 0
    failure: BaseException | None = None
    with contextlib.ExitStack() as stack:
        stack.enter_context(_sigterm_raises())
        feed = (
            stack.enter_context(prefetch_to_device(source, prefetch, mesh)) if prefetch else source
        )
        advance = stack.enter_context(
            progress_bar(
                bool(progress),
                total,
                "train",
                "loss {loss:.4g}  skipped {skipped}",
                feature="jaxwise.train.fit(progress=True)",
                loss=float("nan"),
                skipped=0,
            )
        )

        def record(metrics: dict[str, Any]) -> None:
            nonlocal skipped
            losses.append(float(metrics["loss"]))
            skipped += int(metrics.get("skipped", 0))
            advance(loss=losses[-1], skipped=skipped)

        def checkpoint() -> None:
            if checkpointer is not None and int(state.step) not in saved:  # skipped: nothing new
                checkpointer.save(state, metadata)
                saved.append(int(state.step))

        pending = None
        try:
            for batch in feed:
                state, metrics = step(state, batch)
                if pending is not None:
                    record(pending)  # the previous step's metrics: this step is already queued
                pending = metrics
                if checkpoint_every and (len(losses) + 1) % checkpoint_every == 0:
                    checkpoint()
            if pending is not None:
                record(pending)
                checkpoint()
        except BaseException as err:
            failure = err
            raise
        finally:
            _finish_saves(checkpointer, failure)
    report = FitReport(
        len(losses),
        skipped,
        np.asarray(losses, np.float64),
        tuple(saved),
        time.perf_counter() - started,
    )
    return state, report

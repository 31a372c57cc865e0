"""A streaming training loop: host batches in, device kept busy, NaN-guard counts, checkpoints."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterable, Sized
from typing import Any, Protocol

import numpy as np

from jaxwise._checks import check_callable, check_int
from jaxwise._prefetch import prefetch_to_device
from jaxwise._progress import progress_bar
from jaxwise.train._state import TrainState

__all__ = ["FitReport", "fit"]


class _Saver(Protocol):
    """What :func:`fit` saves checkpoints with: a `jaxwise.checkpoint.Checkpointer`.

    A structural type, so that ``train`` does not import ``checkpoint`` (the layer above it).
    """

    def save(self, state: TrainState, metadata: dict[str, Any] | None = None) -> Any: ...


@dataclasses.dataclass(frozen=True)
class FitReport:
    """What :func:`fit` did.

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

    Batches are transferred by :func:`jaxwise.data.prefetch_to_device` (``prefetch``
    ahead, in a background thread, sharded over ``step.mesh``'s ``"data"`` axis when
    the step has a mesh) while the device trains on earlier ones; each step's metrics
    are read only after the next step is dispatched, so the host never waits for the
    device in between. The NaN guard's skipped steps are counted; with a
    ``checkpointer`` (a `jaxwise.checkpoint.Checkpointer`, which holds its directory's
    writer lock until you close it) the state is saved every ``checkpoint_every`` steps
    and at the end.

    Args:
      step: a :func:`make_train_step` step (or any ``step(state, batch) -> (state,
        metrics)`` whose metrics have ``"loss"`` and ``"skipped"``).
      state: the initial state (donated to the first step, as with ``step``).
      batches: an iterable of batches (pytrees of host arrays); in a multi-process job,
        each process's own rows.
      steps: stop after this many batches (default: when ``batches`` ends).
      checkpointer: saves the checkpoints, e.g. ``Checkpointer(directory, keep=3)``
        from `jaxwise.checkpoint` (``None``: no checkpoints). ``fit`` calls its
        ``save(state, metadata)`` and leaves it open.
      checkpoint_every: save every this many steps (and at the end); needs ``checkpointer``.
      metadata: JSON metadata saved with every checkpoint.
      prefetch: batches kept ready on the devices (0: transfer in the loop).
      progress: show a progress bar on stderr (loss, skipped steps); needs rich (the
        ``cli`` extra).

    Returns:
      ``(state, report)``: the final state and a :class:`FitReport`.

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
        >>> state, report = fit(make_train_step(loss, optim.adam(0.1)), state, batches(),
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
    with contextlib.ExitStack() as stack:
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
    report = FitReport(
        len(losses),
        skipped,
        np.asarray(losses, np.float64),
        tuple(saved),
        time.perf_counter() - started,
    )
    return state, report

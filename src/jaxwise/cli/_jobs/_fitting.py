"""The jobs' epochs as `train.fit` steps, and their callbacks and metric writers.

A job's epoch is one compiled program over the training rows on the device; `EvaluatedEpoch`
makes it a `fit` step whose metrics are the epoch's record (training and validation loss and
accuracy, learning rate, skipped steps, seconds). `fit` numbers the epochs (its batches),
writes each record to the writers (`EpochLog`: ``metrics.jsonl``; TensorBoard and MLflow
with ``--log``), checkpoints, and calls the callbacks: `Progress` (the progress bar) and
`BestEpoch` (early stopping by validation loss, keeping the best state).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from jaxwise.cli._jobs import _common as C
from jaxwise.cli._jobs._cache import CompileTally
from jaxwise.cli._jobs._outputs import append_line
from jaxwise.train import Callback, EarlyStopping, TrainState

__all__ = [
    "LOGS",
    "BestEpoch",
    "EpochLog",
    "EvaluatedEpoch",
    "Progress",
    "check_logs",
    "open_writers",
]

LOGS = ("jsonl", "tensorboard", "mlflow")  # the writers of --log (JSONL is always written)
RECORD = ("loss", "accuracy", "val_loss", "val_accuracy", "lr", "skipped", "seconds")
LOG_DIRS = {"tensorboard": "tensorboard", "mlflow": "mlruns"}  # their places in a run directory


class EvaluatedEpoch:
    """A `fit` step: one epoch of the compiled ``epoch`` program, then the evaluation.

    Its metrics are the epoch's record: ``loss``/``accuracy`` on the training rows and
    ``val_loss``/``val_accuracy`` on the validation rows (after the epoch), the learning
    rate of the epoch's last step, the steps the NaN guard skipped and the epoch's seconds.
    Compilations are counted in ``tally``; ``lrs`` (every step's learning rate) may be a
    ``Future`` (computed in a background thread while the epoch program compiles).
    """

    def __init__(
        self,
        epoch: Any,
        steps_per_epoch: int,
        lrs: np.ndarray | Future[np.ndarray],
        splits: tuple[Any, Any],
        first_epoch: int,
    ) -> None:
        self.epoch, self.spe, self._lrs = epoch, steps_per_epoch, lrs
        self.train_data, self.val_data = splits
        self.epochs_done = first_epoch
        self.tally = CompileTally()

    @property
    def lrs(self) -> np.ndarray:
        if isinstance(self._lrs, Future):
            self._lrs = self._lrs.result()
        return self._lrs

    def __call__(self, state: TrainState, data: Any) -> tuple[TrainState, dict[str, Any]]:
        t0 = time.perf_counter()
        with self.tally.measure():
            state, metrics = self.epoch(state, data)
        seconds = time.perf_counter() - t0
        splits = C.evaluate_splits(state.params, self.train_data, self.val_data)
        loss, acc, val_loss, val_acc = (float(v) for v in splits)
        _, skipped = C.step_metrics(metrics, self.spe)
        self.epochs_done += 1
        record = {
            "loss": loss,
            "accuracy": acc,
            "val_loss": val_loss,
            "val_accuracy": val_acc,
            "lr": float(self.lrs[self.epochs_done * self.spe - 1]),
            "skipped": skipped,
            "seconds": seconds,
        }
        return state, record


class EpochLog:
    """``metrics.jsonl`` as a `jaxwise.metrics.MetricWriter`: one strict-JSON line per epoch.

    ``{"epoch": e, "loss": …, …}`` with non-finite values as ``null`` and ``skipped`` an int;
    each line is appended as it is written (a full disk cuts the file back and names it).
    ``history`` holds the records: those of the epochs before (a resumed run) and the new.
    """

    def __init__(self, path: Path | None, history: list[dict[str, Any]]) -> None:
        self.path, self.history = path, history

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        values: dict[str, Any] = {"epoch": int(step)}
        for key in sorted(scalars, key=lambda k: RECORD.index(k) if k in RECORD else len(RECORD)):
            values[key] = int(scalars[key]) if key == "skipped" else scalars[key]
        record = C.jsonable(values)
        self.history.append(record)
        if self.path is not None:
            append_line(self.path, json.dumps(record, allow_nan=False))

    def flush(self) -> None:
        """Nothing: each line is written by `write`."""

    def close(self) -> None:
        """Nothing to release."""


class Progress(Callback):
    """The jobs' progress bar as a `fit` callback: each epoch's loss and accuracy."""

    every = 1

    def __init__(self, advance: Callable[..., None]) -> None:
        self.advance = advance

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> None:
        del step, state
        self.advance(loss=metrics["loss"], acc=metrics["accuracy"])


class BestEpoch(EarlyStopping):
    """``--early-stopping``: stop after ``patience`` epochs without a lower validation loss.

    Each new best state is handed to ``save_best(state, epoch, progress)``; the count
    (`progress`) is the callback's state, saved in the run's checkpoints by `fit` and handed
    back on ``--resume``.
    """

    def __init__(
        self, patience: int, save_best: Callable[[TrainState, int, dict[str, Any]], None]
    ) -> None:
        super().__init__("val_loss", patience=patience)
        self.save_best = save_best

    def on_step(self, step: int, state: TrainState, metrics: Mapping[str, float]) -> bool:
        stop = super().on_step(step, state, metrics)
        if self.best_step == step:  # a new best
            self.save_best(state, step, self.progress())
        return stop

    def progress(self) -> dict[str, Any]:
        """The count in the form of the run's summary and of older checkpoints."""
        return {
            "best_val_loss": self.best,
            "best_epoch": self.best_step,
            "bad_epochs": self.bad,
            "stopped_early": self.stopped,
        }

    @staticmethod
    def progress_of(state: Mapping[str, Any]) -> dict[str, Any]:
        """A saved ``state_dict`` in the summary's form."""
        return {
            "best_val_loss": state.get("best"),
            "best_epoch": state.get("best_step"),
            "bad_epochs": state.get("bad", 0),
            "stopped_early": bool(state.get("stopped", False)),
        }

    @staticmethod
    def saved(progress: Mapping[str, Any]) -> dict[str, Any]:
        """``progress`` (the summary's form) as the ``state_dict`` `fit` restores."""
        return {
            "best": progress.get("best_val_loss"),
            "best_step": progress.get("best_epoch"),
            "bad": progress.get("bad_epochs", 0),
            "stopped": bool(progress.get("stopped_early", False)),
        }


def check_logs(names: Sequence[str]) -> tuple[str, ...]:
    """``--log``'s writer names, checked (an unknown one is a `UserError` listing the valid).

    Returns:
        The names, without duplicates, in the order given.
    """
    unknown = [n for n in names if n not in LOGS]
    if unknown:
        raise C.UserError(
            f"--log: unknown writer {', '.join(map(repr, unknown))}; expected a comma-separated "
            f"list of {', '.join(LOGS)}"
        )
    return tuple(dict.fromkeys(names))


def open_writers(
    names: Sequence[str], place: Callable[[str], Path], run_name: str, params: Mapping[str, Any]
) -> list[Any]:
    """The writers of ``--log`` besides JSONL, each in ``place(LOG_DIRS[name])``.

    The MLflow run is named ``run_name`` (a resumed run continues it) and records ``params``.

    Raises:
        jaxwise.MissingExtraError: the writer's extra is not installed (one line).
    """
    from jaxwise.metrics import MLflowWriter, TensorBoardWriter

    writers: list[Any] = []
    for name in names:
        if name == "tensorboard":
            writers.append(TensorBoardWriter(place(LOG_DIRS[name])))
        elif name == "mlflow":
            flat = {
                k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in params.items()
            }
            writers.append(MLflowWriter(place(LOG_DIRS[name]), run_name=run_name, params=flat))
    return writers


def _param(value: Any) -> Any:
    """An MLflow parameter: lists and dicts as JSON."""
    return json.dumps(value) if isinstance(value, list | dict) else value

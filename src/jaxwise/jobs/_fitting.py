"""The jobs' epochs as `train.fit` steps, and their callbacks and metric writers.

A job's epoch is one compiled program over the training rows on the device; `EvaluatedEpoch`
makes it a `fit` step whose metrics are the epoch's record (training and validation loss and
accuracy, learning rate, skipped steps, seconds). `fit` numbers the epochs (its batches),
writes each record to the writers (`EpochLog`: ``metrics.jsonl``; TensorBoard and MLflow
with ``--log``), checkpoints, and calls the callbacks: `Progress` (the progress bar) and
`EarlyStopping` (the best epoch by validation loss).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np

from jaxwise.jobs import _common as C
from jaxwise.jobs._cache import CompileTally
from jaxwise.jobs._outputs import append_line
from jaxwise.train import TrainState

__all__ = [
    "LOGS",
    "EarlyStopping",
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


class Progress:
    """The jobs' progress bar as a `fit` callback: each epoch's loss and accuracy."""

    def __init__(self, advance: Callable[..., None]) -> None:
        self.advance = advance

    def __call__(self, state: TrainState, batch: int, scalars: Mapping[str, float]) -> bool:
        del state, batch
        self.advance(loss=scalars["loss"], acc=scalars["accuracy"])
        return False


class EarlyStopping:
    """A `fit` callback: stop after ``patience`` epochs without a lower validation loss.

    ``meta`` (``best_val_loss``, ``best_epoch``, ``bad_epochs``, ``stopped_early``) is kept
    up to date, so that a checkpoint saved with it carries on the count when resumed; each
    new best state is handed to ``save_best(state, epoch)``.
    """

    def __init__(
        self,
        patience: int,
        meta: dict[str, Any],
        save_best: Callable[[TrainState, int], None],
    ) -> None:
        self.patience, self.meta, self.save_best = patience, meta, save_best

    def __call__(self, state: TrainState, batch: int, scalars: Mapping[str, float]) -> bool:
        meta, val_loss = self.meta, scalars["val_loss"]
        best = meta["best_val_loss"]
        if math.isfinite(val_loss) and (best is None or val_loss < best):
            meta.update(best_val_loss=val_loss, best_epoch=batch, bad_epochs=0)
            self.save_best(state, batch)
            return False
        meta["bad_epochs"] += 1
        if meta["bad_epochs"] >= self.patience:
            meta["stopped_early"] = True
            return True
        return False


class EpochCount:
    """A `fit` callback keeping ``meta["epoch"]`` (the checkpoint's epoch) current."""

    def __init__(self, meta: dict[str, Any]) -> None:
        self.meta = meta

    def __call__(self, state: TrainState, batch: int, scalars: Mapping[str, float]) -> bool:
        del state, scalars
        self.meta["epoch"] = batch
        return False


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

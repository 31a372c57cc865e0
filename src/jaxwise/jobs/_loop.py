"""The epoch loop of ``train``/``label-errors``: evaluation, ``metrics.jsonl``, early stopping."""

from __future__ import annotations

import json
import math
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxwise.jobs import _common as C
from jaxwise.jobs._cache import CompileTally
from jaxwise.jobs._outputs import append_line
from jaxwise.train import TrainState

if TYPE_CHECKING:
    from jaxwise.jobs.tabular import Prepared

__all__ = ["EpochLoop", "checkpoint_meta"]


def checkpoint_meta(prep: Prepared, epoch: int, progress: dict[str, Any]) -> dict[str, Any]:
    return {
        "epoch": epoch,
        "config": prep.cfg.fingerprint(),
        "classes": list(prep.table.classes),
        "feature_names": list(prep.table.feature_names),
        "label": prep.cfg.label,
        "hidden": list(prep.cfg.hidden),
        "mean": prep.mean.tolist(),
        "std": prep.std.tolist(),
        "batch_size": prep.batch_size,
        "data": prep.fingerprint,
        **progress,
    }


class EpochLoop:
    """The epoch loop: evaluation, ``metrics.jsonl``, early stopping with the best checkpoint.

    ``lrs`` is the learning rate of every step, or a ``Future`` of it (computed in a
    background thread while the epoch program compiles).
    """

    def __init__(
        self,
        prep: Prepared,
        epoch: Any,
        spe: int,
        lrs: np.ndarray | Future[np.ndarray],
        progress_meta: dict[str, Any],
    ):
        self.prep, self.epoch, self.spe = prep, epoch, spe
        self._lrs = lrs
        self.progress_meta = progress_meta
        self.tally = CompileTally()
        self.skipped = 0
        self.seconds = 0.0
        self.epochs_done = 0
        self.best_params: Any = None
        self.train_data = C.to_device(*prep.split("train"))
        self.val_data = C.to_device(*prep.split("val"))

    @property
    def lrs(self) -> np.ndarray:
        if isinstance(self._lrs, Future):
            self._lrs = self._lrs.result()
        return self._lrs

    def run(
        self, state: TrainState, start: int, stop: int, history: list[dict[str, Any]]
    ) -> TrainState:
        cfg = self.prep.cfg
        self.epochs_done = start
        t_train = time.perf_counter()
        with C.progress(cfg.progress, cfg.epochs, Path(cfg.path).name, completed=start) as advance:
            for e in range(start, stop):
                t0 = time.perf_counter()
                with self.tally.measure():
                    state, metrics = self.epoch(state, self.train_data)
                record = self._record(state, metrics, e + 1, time.perf_counter() - t0)
                history.append(record)
                self._append(record)
                self.epochs_done = e + 1
                advance(
                    loss=record["loss"] if record["loss"] is not None else math.nan,
                    acc=record["accuracy"],
                )
                if self._early_stop(state, record):
                    break
        jax.block_until_ready(state)
        self.seconds = time.perf_counter() - t_train
        return state

    def _record(
        self, state: TrainState, metrics: dict[str, Any], epoch: int, seconds: float
    ) -> dict[str, Any]:
        splits = C.evaluate_splits(state.params, self.train_data, self.val_data)
        loss, acc, val_loss, val_acc = (float(v) for v in splits)
        _, skipped = C.step_metrics(metrics, self.spe)
        self.skipped += skipped
        return C.jsonable(
            {
                "epoch": epoch,
                "loss": loss,
                "accuracy": acc,
                "val_loss": val_loss,
                "val_accuracy": val_acc,
                "lr": float(self.lrs[epoch * self.spe - 1]),
                "skipped": skipped,
                "seconds": seconds,
            }
        )

    def _append(self, record: dict[str, Any]) -> None:
        if self.prep.out is not None:
            append_line(self.prep.out / "metrics.jsonl", json.dumps(record, allow_nan=False))

    def _early_stop(self, state: TrainState, record: dict[str, Any]) -> bool:
        patience = self.prep.cfg.early_stopping
        if patience is None:
            return False
        meta = self.progress_meta
        val_loss = record["val_loss"]
        if val_loss is not None and (
            meta["best_val_loss"] is None or val_loss < meta["best_val_loss"]
        ):
            meta.update(best_val_loss=val_loss, best_epoch=record["epoch"], bad_epochs=0)
            self._save_best(state, record["epoch"])
            return False
        meta["bad_epochs"] += 1
        if meta["bad_epochs"] >= patience:
            meta["stopped_early"] = True
            return True
        return False

    def _save_best(self, state: TrainState, epoch: int) -> None:
        if self.prep.out is None or not self.prep.cfg.checkpoint:
            self.best_params = jax.tree.map(np.array, state.params)
            return
        C.save_reporting(
            self.prep.out / "best",
            state,
            checkpoint_meta(self.prep, epoch, dict(self.progress_meta)),
            self.prep.out.run_id,
        )

"""The settings and the prepared data of ``jaxwise train`` and ``label-errors``.

`TabularConfig` holds the options (checked by ``validate`` before any work); `prepare` reads,
splits and standardises the CSV and claims the run directory (`Prepared`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Any

import numpy as np

from jaxwise import data
from jaxwise._shared._checks import UserError
from jaxwise.checkpoint import data_fingerprint
from jaxwise.cli._jobs import _common as C
from jaxwise.cli._jobs._fitting import check_logs
from jaxwise.cli._jobs._outputs import RunDir

__all__ = ["Prepared", "TabularConfig", "prepare", "run_dir"]


@dataclasses.dataclass(frozen=True)
class TabularConfig:
    """Settings of ``jaxwise train``/``label-errors`` (``batch_size=None``: min(128, rows)).

    Attributes:
        path: the CSV file.
        label: its label column.
        hidden: widths of the hidden layers.
        epochs: training epochs.
        batch_size: mini-batch size (``None``: min(128, training rows)).
        lr: learning rate.
        weight_decay: AdamW's decoupled weight decay.
        val_fraction: share of the rows held out for validation, in (0, 0.9).
        seed: seed of the split, the initialisation and the shuffles.
        out: the output directory (``None``: write nothing).
        drop_na: drop rows with missing cells (counted) instead of failing.
        resume: continue from the checkpoint in ``out``.
        allow_different_data: resume even when the data's fingerprint changed.
        stop_after: stop after this many epochs (a checkpoint to resume from).
        dp: train with DP-SGD (``--dp``).
        clip_norm: the per-example clipping norm with ``dp``.
        noise_multiplier: the noise multiplier σ with ``dp``.
        audit: ``--audit M``: audit the DP run with M canaries (``None``: no audit).
        mechanism: ``--mechanism``: ``dpsgd``, ``bandmf``, ``blt`` or ``auto`` (``None``:
            DP-SGD).
        bands: ``--bands``: BandMF's bands (``None``: chosen).
        adaptive_clip: ``--adaptive-clip Q``: the clip norm tracks the Q-quantile of the
            gradient norms, starting at ``clip_norm`` (``None``: a fixed clip).
        progress: show a progress bar.
        plots: write the PNG plots.
        early_stopping: patience in epochs (keeps the best checkpoint by validation loss).
        checkpoint: write checkpoints in ``out``.
        cache: use the persistent compilation cache.
        cache_dir: its directory (``None``: `default_cache_dir`).
        force: ``--force``: start afresh in a run directory of another configuration.
        out_option: the option that named ``out``, for messages (``--out``/``--run-dir``).
        log: ``--log``: the metric writers besides ``metrics.jsonl`` (``"tensorboard"``,
            ``"mlflow"``), in ``out``.
        checkpoint_every: ``--checkpoint-every``: save a checkpoint every this many epochs
            (and at the end).
    """

    path: str
    label: str
    hidden: tuple[int, ...] = (64, 64)
    epochs: int = 50
    batch_size: int | None = None
    lr: float = 1e-2
    weight_decay: float = 1e-4
    val_fraction: float = 0.2
    seed: int = 0
    out: str | None = "runs/train"
    drop_na: bool = False
    resume: bool = False
    force: bool = False
    allow_different_data: bool = False
    stop_after: int | None = None
    dp: bool = False
    clip_norm: float = 1.0
    noise_multiplier: float = 1.1
    audit: int | None = None
    mechanism: str | None = None
    bands: int | None = None
    adaptive_clip: float | None = None
    progress: bool = True
    plots: bool = True
    early_stopping: int | None = None
    checkpoint: bool = True
    cache: bool = True
    cache_dir: str | None = None
    out_option: str = "--out"
    log: tuple[str, ...] = ()
    checkpoint_every: int = 1

    def validate(self) -> None:
        """Check every setting (before any work).

        Raises:
            UserError: a setting is out of range or options conflict; the message names the
                option.
        """
        C.check_training_options(self)
        C.option_float(
            self.val_fraction,
            "--val-fraction",
            min_value=0.0,
            max_value=0.9,
            min_inclusive=False,
            max_inclusive=False,
        )
        if self.stop_after is not None:
            C.option_int(self.stop_after, "--stop-after", min_value=1, max_value=self.epochs)
        if self.early_stopping is not None:
            C.option_int(self.early_stopping, "--early-stopping", min_value=1)
        C.option_int(self.checkpoint_every, "--checkpoint-every", min_value=1)
        check_logs(self.log)
        if self.resume and not (self.out and self.checkpoint):
            raise UserError("--resume needs --out (the checkpoint lives in OUT/checkpoint)")
        C.check_dp_options(self)
        C.check_audit_option(self)
        if self.audit and (self.resume or self.stop_after or self.early_stopping):
            raise UserError(
                "--audit audits one whole run: it cannot be combined with --resume, "
                "--stop-after or --early-stopping"
            )
        if self.resume and self.force:
            raise UserError(
                "--resume continues the run in --out, --force starts it afresh: not both"
            )

    def fingerprint(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpoint.

        Returns:
            ``{setting: value}`` of the settings that decide the model and its training.
        """
        keys = (
            "label",
            "hidden",
            "epochs",
            "batch_size",
            "lr",
            "weight_decay",
            "val_fraction",
            "seed",
            "dp",
            "clip_norm",
            "noise_multiplier",
            "mechanism",
            "bands",
            "adaptive_clip",
            "drop_na",
            "early_stopping",
        )
        return {k: C.jsonable(getattr(self, k)) for k in keys}


@dataclasses.dataclass
class Prepared:
    """The data as the model sees it, and where the run writes."""

    cfg: TabularConfig
    table: data.Table
    x_all: np.ndarray  # standardised float32, every row
    train_idx: np.ndarray
    val_idx: np.ndarray
    mean: np.ndarray
    std: np.ndarray
    batch_size: int
    out: RunDir | None

    def split(self, which: str) -> tuple[np.ndarray, np.ndarray]:
        idx = self.train_idx if which == "train" else self.val_idx
        return self.x_all[idx], self.table.y[idx]

    @functools.cached_property
    def fingerprint(self) -> dict[str, Any]:
        """Shapes, dtypes and SHA-256 of the training rows (refuses resuming on other data)."""
        return data_fingerprint(self.split("train"))


def run_dir(cfg: TabularConfig, names: tuple[str, ...], job: str) -> Any:
    """The locked run directory of ``cfg.out`` (a context manager), or a null context."""
    if not cfg.out:
        return contextlib.nullcontext(None)
    return RunDir(cfg.out, cfg.out_option, names, job)


def _check_class_rows(cfg: TabularConfig, table: data.Table) -> None:
    """Every class needs two rows: one to train on, one to validate with."""
    counts = np.bincount(table.y, minlength=len(table.classes))
    few = [(c, int(k)) for c, k in zip(table.classes, counts) if k < 2]
    if few:
        name, count = few[0]
        others = f" (and {len(few) - 1} more such classes)" if len(few) > 1 else ""
        raise UserError(
            f"{cfg.path}: class {name!r} of --label {cfg.label} has {count} row{others}; "
            "each class needs at least 2 rows (training and validation): add rows or drop "
            "the class"
        )


def prepare(cfg: TabularConfig, out: RunDir | None = None) -> Prepared:
    """Read, split and standardise the CSV; resolve ``--batch-size``; claim ``out`` (locked)."""
    try:
        table = data.load_csv(cfg.path, cfg.label, drop_na=cfg.drop_na)
    except data.DataError as err:
        raise UserError(str(err)) from None
    C.check_hidden(cfg.hidden, table.x.shape[1], len(table.classes))
    n = len(table.y)
    if n < 2:
        raise UserError(f"{cfg.path}: {n} data row; need at least 2 (training and validation)")
    _check_class_rows(cfg, table)
    order = np.random.default_rng(cfg.seed).permutation(n)
    n_val = min(n - 1, max(1, int(round(n * cfg.val_fraction))))
    val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
    batch_size = cfg.batch_size if cfg.batch_size is not None else min(128, len(train_idx))
    if len(train_idx) < batch_size:
        raise UserError(
            f"{cfg.path}: {len(train_idx)} training rows "
            f"(after the {cfg.val_fraction:.0%} validation split) "
            f"is fewer than --batch-size {batch_size}; lower --batch-size"
        )
    x64 = table.x.astype(np.float64)
    mean = x64[train_idx].mean(0)
    std = x64[train_idx].std(0)
    std = np.where(std > 0, std, 1.0)
    x_all = ((x64 - mean) / std).astype(np.float32)
    if not np.isfinite(x_all).all():
        raise UserError(
            f"{cfg.path}: the standardised features are not finite in float32; rescale the columns"
        )
    prep = Prepared(cfg, table, x_all, train_idx, val_idx, mean, std, batch_size, None)
    if out is not None:
        out.claim(
            cfg.fingerprint(),
            {"sha256": prep.fingerprint["sha256"]},
            resume=cfg.resume,
            force=cfg.force,
        )
        prep.out = out
    return prep

"""``jaxwise train``: an MLP classifier on the user's CSV, in phases (prepare, fit, verify, report).

``prepare`` locks the output directory (before any work), reads and standardises the data
and claims the directory for this run (refusing another job's or another configuration's
run unless ``--force``); ``fit`` runs
the compiled epochs, writes ``metrics.jsonl`` (one JSON object per epoch), keeps the best
checkpoint by validation loss with ``--early-stopping`` and the latest one for ``--resume``;
``verify`` refuses a run that trained nothing; ``report`` draws the plots and returns the
summary. ``label-errors`` reuses ``prepare`` and ``fit``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import json
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise import data
from jaxwise._checks import UserError
from jaxwise.checkpoint import (
    CheckpointError,
    data_fingerprint,
    latest_step,
    load_metadata,
    save,
)
from jaxwise.jobs import _common as C
from jaxwise.jobs._cache import CompileTally
from jaxwise.jobs._loop import EpochLoop, checkpoint_meta
from jaxwise.jobs._outputs import SUMMARY, RunDir, atomic_write, hold_for_tests, write_summary
from jaxwise.jobs._overlap import compile_one_shot, overlapped, precompile
from jaxwise.train import TrainState

__all__ = ["TabularConfig", "fit", "prepare", "run_train"]

TRAIN_OUTPUTS = ("checkpoint", "best", "metrics.jsonl", "loss.png", "curves.png", "confusion.png")
TRAIN_OUTPUTS += (SUMMARY,)


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


@dataclasses.dataclass
class Fitted:
    """The outcome of `fit`."""

    params: Any
    history: list[dict[str, Any]]
    start_epoch: int
    epochs_completed: int
    steps_per_epoch: int
    schedule: Any
    tally: CompileTally
    skipped: int
    steps: int
    train_seconds: float
    best_epoch: int | None = None
    stopped_early: bool = False
    history_complete: bool = True
    checkpoint_written: Future[Any] | None = None  # the final save, written in the background
    audit: dict[str, Any] | None = None
    train_rows: int = 0  # the rows trained on: the training split and the included canaries


def run_dir(cfg: TabularConfig, names: tuple[str, ...], job: str) -> Any:
    """The locked run directory of ``cfg.out`` (a context manager), or a null context."""
    if not cfg.out:
        return contextlib.nullcontext(None)
    return RunDir(cfg.out, cfg.out_option, names, job)


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


def run_train(cfg: TabularConfig) -> dict[str, Any]:
    """Train an MLP classifier on a CSV.

    Args:
        cfg: the settings.

    Returns:
        The JSON-ready summary (accuracies, confusion, outputs).
    """
    cfg.validate()
    t_start = time.perf_counter()
    from jaxwise.jobs._cache import default_cache_dir, persistent_cache

    cache_dir = (
        (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()) if cfg.cache else None
    )
    with (
        run_dir(cfg, TRAIN_OUTPUTS, "train") as out,
        persistent_cache(cache_dir) as cache_dir,
        overlapped() as background,
        C.checkpoint_warnings_as_lines(),  # also those of the final save, in `background`
    ):
        hold_for_tests()
        prep = prepare(cfg, out)
        fitted = fit(prep, background)
        verify(prep, fitted)
        summary = report(prep, fitted, time.perf_counter() - t_start, cache_dir)
        write_summary(out, summary)
        return summary


# --------------------------------------------------------------------------
# fit
# --------------------------------------------------------------------------


def _optimizer(prep: Prepared, steps_per_epoch: int) -> tuple[Any, Any]:
    cfg = prep.cfg
    total_steps = cfg.epochs * steps_per_epoch
    return C.make_optimizer(
        total_steps, cfg.lr, cfg.weight_decay, min(100, total_steps // 10), cfg.lr / 100
    )


def _warm_up(
    prep: Prepared,
    background: ThreadPoolExecutor,
    build: Any,
    params_shape: Any,
    lrs: Any,
    data: tuple[Any, Any],
) -> tuple[Future[TrainState], Future[np.ndarray]]:
    """Everything the run will need besides the epoch program, built in ``background``.

    In order: the initial state (a one-shot program), the learning rates, the evaluation
    program (``data``: the training and validation rows on the device), the validation
    predictions (the confusion matrix) and, with plots, matplotlib.
    """
    state = background.submit(lambda: compile_one_shot(build)())
    rates = background.submit(lrs)
    train, val = data
    background.submit(precompile, C.evaluate_splits, params_shape, train, val)
    background.submit(precompile, C.predict_classes, params_shape, val[0])
    if prep.out is not None and prep.cfg.plots:
        background.submit(importlib.import_module, "jaxwise._plotting")
        for module in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
            background.submit(importlib.import_module, module)
    return state, rates


def _run_id(prep: Prepared) -> str | None:
    return prep.out.run_id if prep.out is not None else None


def _check_resumable(prep: Prepared, ckpt: Path) -> dict[str, Any]:
    """The checkpoint's metadata, after checking that this run may continue it."""
    cfg, table = prep.cfg, prep.table
    run_id = _run_id(prep)
    if latest_step(ckpt, run_id=run_id) is None:
        try:  # why not: nothing there, or only damaged steps and other runs' steps
            load_metadata(ckpt, run_id=run_id)
        except CheckpointError as err:
            detail = str(err).split(": ", 1)[1] if ": " in str(err) else ""
            if detail:
                raise UserError(f"--resume: no usable checkpoint in {ckpt}: {detail}") from None
        raise UserError(f"--resume: no checkpoint in {ckpt}")
    meta = load_metadata(ckpt, run_id=run_id)  # the run's settings: checked before restoring
    saved, now = meta.get("config", {}), cfg.fingerprint()
    for key in now:
        if key in saved and saved.get(key) != now[key]:
            raise UserError(
                f"--resume: the checkpoint was trained with {key}={saved.get(key)!r}, "
                f"got {now[key]!r}"
            )
    if meta.get("classes") != list(table.classes) or meta.get("feature_names") != list(
        table.feature_names
    ):
        raise UserError(
            f"--resume: {cfg.path} has different columns or classes than the checkpointed run"
        )
    if not cfg.allow_different_data and "data" in meta and meta["data"] != prep.fingerprint:
        raise UserError(
            f"--resume: the training rows of {cfg.path} differ from the checkpointed run's "
            "(pass --allow-different-data to continue anyway)"
        )
    return meta


def _restore(ckpt: Path, like: Any, run_id: str | None) -> tuple[TrainState, dict[str, Any]]:
    """The run's checkpointed state and the metadata of the step actually restored.

    A damaged newest step is skipped, said in one line on stderr.
    """
    return C.restore_reporting(ckpt, like, run_id)


def _history_so_far(prep: Prepared, start_epoch: int) -> list[dict[str, Any]]:
    """The epochs already in ``metrics.jsonl`` (resume), rewritten without later lines."""
    if prep.out is None:
        return []
    path = prep.out / "metrics.jsonl"
    history = []
    if start_epoch and path.exists():
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise UserError(
                f"--resume: {path} is not UTF-8 text (byte {err.start}); restore it or move it "
                "away (the checkpoint is untouched)"
            ) from None
        for line in text.splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if (
                isinstance(record, dict)
                and isinstance(record.get("epoch"), int)
                and record["epoch"] <= start_epoch
            ):
                history.append(record)
    lines = "".join(json.dumps(r, allow_nan=False) + "\n" for r in history)
    atomic_write(path, lambda f: f.write(lines))
    return history


def fit(prep: Prepared, background: ThreadPoolExecutor | None = None) -> Fitted:
    """Train (or continue) the MLP; each epoch's metrics to ``metrics.jsonl``; checkpoints.

    With ``background`` (a `jobs._overlap.overlapped` pool), the initial state and the
    evaluation programs are built there while the epoch program compiles, and the final
    checkpoint is written there while the model is verified (``Fitted.checkpoint_written``).
    """
    if background is None:
        with overlapped() as own:
            fitted = fit(prep, own)
            if fitted.checkpoint_written is not None:
                fitted.checkpoint_written.result()
            return fitted
    cfg = prep.cfg
    run_cfg = dataclasses.replace(cfg, batch_size=prep.batch_size)
    xtr, ytr = prep.split("train")
    canaries = C.audit_canaries_for(cfg, xtr, ytr, len(prep.table.classes)) if cfg.audit else None
    if canaries is not None:  # train on the canaries too; evaluate real rows in their layout
        fit_x, fit_y = canaries.train_data((xtr, ytr))
        xva, yva = prep.split("val")
        train, val = C.to_device(fit_x, fit_y), C.to_device(canaries.pad(xva), yva)
    else:
        train, val = C.to_device(xtr, ytr), C.to_device(*prep.split("val"))
    fit_rows = len(train[1])
    spe = C.steps_per_epoch(fit_rows, run_cfg)
    tx, schedule = _optimizer(prep, spe)
    n_in = train[0].shape[1]  # with --audit: one extra input feature per canary
    sizes = (n_in, *cfg.hidden, len(prep.table.classes))
    gradient = C.state_gradient(run_cfg, fit_rows)  # the DP noise buffers / adaptive clip
    build = jax.jit(functools.partial(C.initial_state, tx, sizes, cfg.seed, gradient))
    state_shape = jax.eval_shape(build)
    pending_state, lrs = _warm_up(
        prep,
        background,
        build,
        state_shape.params,
        lambda: np.asarray(C.schedule_values(schedule, cfg.epochs * spe)),
        (train, val),
    )
    # an audited run's model has canary features: it is not checkpointed (predict needs d)
    checkpoints = cfg.checkpoint and canaries is None
    ckpt = prep.out / "checkpoint" if prep.out is not None and checkpoints else None
    progress_meta: dict[str, Any] = {
        "best_val_loss": None,
        "best_epoch": None,
        "bad_epochs": 0,
        "stopped_early": False,
    }
    if ckpt is not None and not cfg.resume and latest_step(ckpt) is not None:
        raise UserError(
            f"{ckpt} already holds a checkpoint; pass --resume to continue it, --force to start "
            f"afresh, or choose another {cfg.out_option}"
        )
    start_epoch, resumed = 0, None
    if cfg.resume and ckpt is not None:
        _check_resumable(prep, ckpt)
        # onto the default device, like a new one
        resumed, meta = _restore(ckpt, state_shape, _run_id(prep))
        progress_meta.update({k: meta.get(k, v) for k, v in progress_meta.items()})
        start_epoch = int(meta["epoch"])
    history = _history_so_far(prep, start_epoch)
    last_epoch = max(cfg.stop_after if cfg.stop_after is not None else cfg.epochs, start_epoch)
    if progress_meta["stopped_early"]:
        last_epoch = start_epoch
    loop = EpochLoop(prep, C.make_epoch(run_cfg, n_train=fit_rows), spe, lrs, progress_meta)
    loop.train_data, loop.val_data = train, val
    if last_epoch > start_epoch:
        with loop.tally.measure():  # the epoch program, compiled while the state is built
            precompile(loop.epoch.jitted, state_shape, loop.train_data)
    state = pending_state.result() if resumed is None else resumed
    state = loop.run(state, start_epoch, last_epoch, history)
    written = None
    run_id = _run_id(prep)
    if ckpt is not None and latest_step(ckpt, run_id=run_id) != int(state.step):
        meta = checkpoint_meta(prep, loop.epochs_done, loop.progress_meta)
        written = background.submit(functools.partial(save, run_id=run_id), ckpt, state, meta)
    params = state.params
    if (
        cfg.early_stopping is not None
        and prep.out is not None
        and latest_step(prep.out.path / "best", run_id=run_id) is not None
    ):
        params = C.restore_reporting(prep.out.path / "best", state, run_id)[0].params
    elif cfg.early_stopping is not None and loop.best_params is not None:
        params = loop.best_params
    audit = None
    if canaries is not None:  # score the canaries, then drop their input features
        audit, params = C.audit_run(params, canaries, xtr.shape[1])
    return Fitted(
        params,
        history,
        start_epoch,
        loop.epochs_done,
        spe,
        schedule,
        loop.tally,
        loop.skipped,
        (loop.epochs_done - start_epoch) * spe,
        loop.seconds,
        loop.progress_meta["best_epoch"],
        bool(loop.progress_meta["stopped_early"]),
        history_complete=len(history) == loop.epochs_done,
        checkpoint_written=written,
        audit=audit,
        train_rows=fit_rows,
    )


# --------------------------------------------------------------------------
# verify and report
# --------------------------------------------------------------------------


def verify(prep: Prepared, fitted: Fitted) -> None:
    """A run that trained nothing or ended with a non-finite loss is not reported as a success."""
    last = (
        fitted.history[-1]["loss"]
        if fitted.history and fitted.epochs_completed > fitted.start_epoch
        else 0.0
    )
    C.check_run_health(
        math.nan if last is None else last, fitted.skipped, fitted.steps, Path(prep.cfg.path).name
    )


def confusion(
    params: Any, x: np.ndarray, y: np.ndarray, n_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """(predicted classes, confusion matrix with rows true and columns predicted)."""
    pred = np.asarray(C.predict_classes(params, C.to_device(x)))
    matrix = np.zeros((n_classes, n_classes), np.int64)
    np.add.at(matrix, (y, pred), 1)
    return pred, matrix


def _plots(prep: Prepared, fitted: Fitted, matrix: np.ndarray) -> dict[str, str]:
    from jaxwise._plotting import plot_confusion, plot_curves, plot_training

    out, outputs = prep.out, {}
    assert out is not None
    outputs["confusion_plot"] = str(
        plot_confusion(out / "confusion.png", matrix, prep.table.classes)
    )
    if fitted.history and fitted.history_complete:  # never replace a full plot with a partial one
        losses = np.asarray([np.nan if h["loss"] is None else h["loss"] for h in fitted.history])
        lrs = np.asarray(
            C.schedule_values(fitted.schedule, prep.cfg.epochs * fitted.steps_per_epoch)
        )
        outputs["loss_plot"] = str(
            plot_training(
                out / "loss.png",
                np.repeat(losses, fitted.steps_per_epoch),
                fitted.steps_per_epoch,
                lrs,
                title="training loss",
            )
        )
        outputs["curves_plot"] = str(
            plot_curves(out / "curves.png", fitted.history, best_epoch=fitted.best_epoch)
        )
    return outputs


def report(
    prep: Prepared, fitted: Fitted, total_seconds: float, cache_dir: Path | None
) -> dict[str, Any]:
    """Plots (unless ``--no-plots``) and the JSON-ready summary."""
    cfg, table = prep.cfg, prep.table
    (xtr, ytr), (xva, yva) = prep.split("train"), prep.split("val")
    pred, matrix = confusion(fitted.params, xva, yva, len(table.classes))
    if fitted.checkpoint_written is not None:  # written meanwhile; a full disk leaves the
        fitted.checkpoint_written.result()  # previous plots as they were: checkpoint first
    outputs = _plots(prep, fitted, matrix) if prep.out is not None and cfg.plots else {}
    if prep.out is not None:
        if cfg.checkpoint and fitted.audit is None:  # an audited run writes no checkpoint
            outputs["checkpoint"] = str(prep.out.path / "checkpoint")
        outputs["metrics"] = str(prep.out.path / "metrics.jsonl")
    val_acc = float((pred == yva).mean())
    summary: dict[str, Any] = {
        "schema": 1,
        "job": "train",
        "compiles": fitted.tally.total,
        "compile": fitted.tally.as_dict(cache_dir),
        "train_accuracy": float(
            C.evaluate_splits(fitted.params, C.to_device(xtr, ytr), C.to_device(xva, yva))[1]
        ),
        "val_accuracy": val_acc,
        "test_accuracy": val_acc,
        "epochs_completed": fitted.epochs_completed,
        "epochs": cfg.epochs,
        "best_epoch": fitted.best_epoch,
        "stopped_early": fitted.stopped_early,
        "resumed_from_epoch": fitted.start_epoch if cfg.resume else None,
        "rows": int(len(table.y)),
        "dropped_rows": table.dropped,
        "blank_lines": table.blank_lines,
        "train_rows": int(len(xtr)),
        "validation_rows": int(len(xva)),
        "batch_size": prep.batch_size,
        "features": list(table.feature_names),
        "classes": list(table.classes),
        "confusion_matrix": matrix,
        "final_loss": fitted.history[-1]["loss"] if fitted.history else None,
        "skipped": fitted.skipped,
        "steps": fitted.steps,
        "timings": {
            "total_s": total_seconds,
            "train_s": fitted.train_seconds,
            "compile_s": fitted.tally.seconds,
        },
        "outputs": outputs,
        "params_sha256": C.params_digest(fitted.params),
    }
    if cfg.dp:
        summary["dp"] = C.dp_report(
            dataclasses.replace(cfg, batch_size=prep.batch_size),
            fitted.train_rows,
            fitted.epochs_completed * fitted.steps_per_epoch,
        )
        if fitted.audit is not None:
            summary["dp"].update(fitted.audit)
    return C.jsonable(summary)

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
import itertools
import json
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise._shared._checks import UserError
from jaxwise.checkpoint import (
    Checkpointer,
    CheckpointError,
    latest_step,
    load_metadata,
)
from jaxwise.cli._jobs import _common as C
from jaxwise.cli._jobs._cache import CompileTally
from jaxwise.cli._jobs._fitting import (
    LOG_DIRS,
    BestEpoch,
    EpochLog,
    EvaluatedEpoch,
    Progress,
    open_writers,
)
from jaxwise.cli._jobs._outputs import SUMMARY, atomic_write, hold_for_tests, write_summary
from jaxwise.cli._jobs._overlap import compile_one_shot, overlapped, precompile
from jaxwise.cli._jobs._prepare import Prepared, TabularConfig, prepare, run_dir
from jaxwise.train import Checkpointing, FitReport, MetricLogging, Resume, TrainState
from jaxwise.train import fit as train_fit

__all__ = ["Prepared", "TabularConfig", "fit", "prepare", "run_dir", "run_train"]

TRAIN_OUTPUTS = ("checkpoint", "best", "metrics.jsonl", "loss.png", "curves.png", "confusion.png")
TRAIN_OUTPUTS += (SUMMARY, *LOG_DIRS.values())
PROGRESS: dict[str, Any] = {  # early stopping's count (`BestEpoch`'s state in the checkpoints)
    "best_val_loss": None,
    "best_epoch": None,
    "bad_epochs": 0,
    "stopped_early": False,
}


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
    audit: dict[str, Any] | None = None
    train_rows: int = 0  # the rows trained on: the training split and the included canaries


def run_train(cfg: TabularConfig) -> dict[str, Any]:
    """Train an MLP classifier on a CSV.

    Args:
        cfg: the settings.

    Returns:
        The JSON-ready summary (accuracies, confusion, outputs).
    """
    cfg.validate()
    t_start = time.perf_counter()
    from jaxwise.cli._jobs._cache import default_cache_dir, persistent_cache

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
        background.submit(importlib.import_module, "jaxwise.cli._plotting")
        for module in ("matplotlib.figure", "matplotlib.backends.backend_agg"):
            background.submit(importlib.import_module, module)
    return state, rates


def checkpoint_meta(prep: Prepared) -> dict[str, Any]:
    """The metadata of the run's checkpoints: what ``--resume`` and ``predict`` check and need.

    The epoch and early stopping's count are `fit`'s (``metadata["fit"]``: the batch count
    and `BestEpoch`'s state); a best checkpoint has them at the top level.
    """
    return {
        "config": prep.cfg.fingerprint(),
        "classes": list(prep.table.classes),
        "feature_names": list(prep.table.feature_names),
        "label": prep.cfg.label,
        "hidden": list(prep.cfg.hidden),
        "mean": prep.mean.tolist(),
        "std": prep.std.tolist(),
        "batch_size": prep.batch_size,
        "data": prep.fingerprint,
    }


@dataclasses.dataclass(frozen=True)
class _Continued:
    """Where the run starts: the epochs done and early stopping's count (a new run: none)."""

    epoch: int = 0
    progress: dict[str, Any] = dataclasses.field(default_factory=lambda: dict(PROGRESS))

    @classmethod
    def saved(cls, meta: dict[str, Any]) -> _Continued:
        """The start a checkpoint's metadata records (`fit`'s record; an older run's top level)."""
        older = {k: meta.get(k, v) for k, v in PROGRESS.items()}  # an older jaxwise's keys
        record = meta.get("fit") if isinstance(meta.get("fit"), dict) else None
        if record is None or not isinstance(record.get("batches"), int):
            return cls(int(meta["epoch"]), older)
        states = record.get("callbacks") if isinstance(record.get("callbacks"), dict) else {}
        best = states.get("BestEpoch")
        progress = BestEpoch.progress_of(best) if isinstance(best, dict) else older
        return cls(int(record["batches"]), progress)


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


@dataclasses.dataclass
class _Setup:
    """The data on the device and what is built for the run (in the background, mostly)."""

    train: Any
    val: Any
    canaries: Any
    steps_per_epoch: int
    schedule: Any
    state_shape: Any
    pending_state: Future[TrainState]
    lrs: Future[np.ndarray]


def _setup(prep: Prepared, background: ThreadPoolExecutor) -> _Setup:
    """Device data, optimizer, and the initial state and programs started in ``background``."""
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
    spe = C.steps_per_epoch(len(train[1]), run_cfg)
    tx, schedule = _optimizer(prep, spe)
    n_in = train[0].shape[1]  # with --audit: one extra input feature per canary
    sizes = (n_in, *cfg.hidden, len(prep.table.classes))
    gradient = C.run_gradient(run_cfg, len(train[1]))  # the DP noise buffers / adaptive clip
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
    return _Setup(train, val, canaries, spe, schedule, state_shape, pending_state, lrs)


def _start(
    prep: Prepared, setup: _Setup, ckpt: Path | None
) -> tuple[TrainState | None, _Continued]:
    """The restored state (``None``: a new run) and where the run continues."""
    cfg = prep.cfg
    if ckpt is not None and not cfg.resume and latest_step(ckpt) is not None:
        raise UserError(
            f"{ckpt} already holds a checkpoint; pass --resume to continue it, --force to start "
            f"afresh, or choose another {cfg.out_option}"
        )
    if not (cfg.resume and ckpt is not None):
        return None, _Continued()
    _check_resumable(prep, ckpt)
    # onto the default device, like a new one
    resumed, saved = _restore(ckpt, setup.state_shape, _run_id(prep))
    return resumed, _Continued.saved(saved)


def fit(prep: Prepared, background: ThreadPoolExecutor | None = None) -> Fitted:
    """Train (or continue) the MLP with `train.fit`: one compiled program per epoch.

    Each epoch's record goes to ``metrics.jsonl`` (and the ``--log`` writers); the state is
    checkpointed every ``checkpoint_every`` epochs and at the end (asynchronously), the best
    one by validation loss with ``--early-stopping``. With ``background`` (a
    `jobs._overlap.overlapped` pool), the initial state and the evaluation programs are built
    there while the epoch program compiles.
    """
    if background is None:
        with overlapped() as own:
            return fit(prep, own)
    cfg = prep.cfg
    setup = _setup(prep, background)
    # an audited run's model has canary features: it is not checkpointed (predict needs d)
    checkpoints = cfg.checkpoint and setup.canaries is None
    ckpt = prep.out / "checkpoint" if prep.out is not None and checkpoints else None
    resumed, start = _start(prep, setup, ckpt)
    start_epoch = start.epoch
    history = _history_so_far(prep, start_epoch)
    last_epoch = max(cfg.stop_after if cfg.stop_after is not None else cfg.epochs, start_epoch)
    if start.progress["stopped_early"]:
        last_epoch = start_epoch
    run_cfg = dataclasses.replace(cfg, batch_size=prep.batch_size)
    step = EvaluatedEpoch(
        C.build_epoch(run_cfg, n_train=len(setup.train[1])),
        setup.steps_per_epoch,
        setup.lrs,
        (setup.train, setup.val),
        start_epoch,
    )
    if last_epoch > start_epoch:
        with step.tally.measure():  # the epoch program, compiled while the state is built
            precompile(step.epoch.jitted, setup.state_shape, setup.train)
    state = setup.pending_state.result() if resumed is None else resumed
    best = _Best(prep, checkpoint_meta(prep))
    state, report, progress = _epochs(prep, step, state, ckpt, start, history, last_epoch, best)
    params = best.params(state) if cfg.early_stopping is not None else state.params
    audit = None
    if setup.canaries is not None:  # score the canaries, then drop their input features
        audit, params = C.audit_run(params, setup.canaries, prep.split("train")[0].shape[1])
    done = start_epoch + (report.steps if report else 0)
    return Fitted(
        params,
        history,
        start_epoch,
        done,
        setup.steps_per_epoch,
        setup.schedule,
        step.tally,
        report.skipped if report else 0,
        (done - start_epoch) * setup.steps_per_epoch,
        report.seconds if report else 0.0,
        progress["best_epoch"],
        bool(progress["stopped_early"]),
        history_complete=len(history) == done,
        audit=audit,
        train_rows=len(setup.train[1]),
    )


class _Best:
    """The best state by validation loss (``--early-stopping``): in ``OUT/best``, or in memory."""

    def __init__(self, prep: Prepared, meta: dict[str, Any]) -> None:
        self.prep, self.meta = prep, meta
        self.kept: Any = None

    def save(self, state: TrainState, epoch: int, progress: dict[str, Any]) -> None:
        out = self.prep.out
        if out is None or not self.prep.cfg.checkpoint:
            self.kept = jax.tree.map(np.array, state.params)
            return
        meta = {**self.meta, "epoch": epoch, **progress}
        C.save_reporting(out / "best", state, meta, out.run_id)

    def params(self, state: TrainState) -> Any:
        """The best parameters (the final ones when no epoch improved)."""
        out, run_id = self.prep.out, _run_id(self.prep)
        if out is not None and latest_step(out.path / "best", run_id=run_id) is not None:
            return C.restore_reporting(out.path / "best", state, run_id)[0].params
        return self.kept if self.kept is not None else state.params


def _epochs(
    prep: Prepared,
    step: EvaluatedEpoch,
    state: TrainState,
    ckpt: Path | None,
    start: _Continued,
    history: list[dict[str, Any]],
    last_epoch: int,
    best: _Best,
) -> tuple[TrainState, FitReport | None, dict[str, Any]]:
    """The epochs ``start.epoch + 1 … last_epoch`` through `train.fit`.

    Returns:
        The state, `fit`'s report (None: no epoch to train) and early stopping's count.
    """
    cfg, first = prep.cfg, start.epoch
    if last_epoch <= first:
        return state, None, start.progress
    log = EpochLog(prep.out / "metrics.jsonl" if prep.out is not None else None, history)
    bar = C.progress(cfg.progress, cfg.epochs, Path(cfg.path).name, completed=first)
    record: dict[str, Any] = {"batches": first}  # fit counts epochs on; the data is a repeat
    with contextlib.ExitStack() as stack:
        callbacks: list[Any] = [Progress(stack.enter_context(bar))]
        early = None
        if cfg.early_stopping is not None:
            early = BestEpoch(cfg.early_stopping, best.save)
            callbacks.append(early)
            record["callbacks"] = {"BestEpoch": BestEpoch.saved(start.progress)}
        callbacks.append(MetricLogging([log, *_log_writers(prep, stack)]))
        if ckpt is not None:
            saver = stack.enter_context(Checkpointer(ckpt, run_id=_run_id(prep)))
            meta = checkpoint_meta(prep)
            callbacks.append(Checkpointing(saver, every=cfg.checkpoint_every, metadata=meta))
        repeated = itertools.repeat(step.train_data)  # one epoch program per batch
        state, report = train_fit(
            step,
            state,
            repeated,
            steps=last_epoch - first,
            prefetch=0,
            resume=Resume({"fit": record}, positioned=True),
            callbacks=callbacks,
        )
    return state, report, early.progress() if early is not None else start.progress


def _log_writers(prep: Prepared, stack: contextlib.ExitStack) -> list[Any]:
    """The ``--log`` writers besides JSONL (closed with ``stack``)."""
    if prep.out is None or not prep.cfg.log:
        return []
    out = prep.out
    run_name = out.run_id or out.path.resolve().name  # a run of an older jaxwise has no id
    writers = open_writers(prep.cfg.log, lambda name: out / name, run_name, prep.cfg.fingerprint())
    for w in writers:
        stack.callback(w.close)
    return writers


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
    from jaxwise.cli._plotting import plot_confusion, plot_curves, plot_training

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
    outputs = _plots(prep, fitted, matrix) if prep.out is not None and cfg.plots else {}
    if prep.out is not None:
        if cfg.checkpoint and fitted.audit is None:  # an audited run writes no checkpoint
            outputs["checkpoint"] = str(prep.out.path / "checkpoint")
        outputs["metrics"] = str(prep.out.path / "metrics.jsonl")
        for name in cfg.log:  # the --log writers' directories
            outputs[name] = str(prep.out.path / LOG_DIRS[name])
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

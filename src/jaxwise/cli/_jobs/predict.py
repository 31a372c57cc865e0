"""``jaxwise predict RUN_DIR DATA.csv --out PREDICTIONS.csv``: apply a ``train`` run to new rows.

Phases: ``prepare`` (``--out`` locked; the run directory locked for reading — refused while
a job writes it — and checked to be a ``train`` run; the run's stored feature names,
standardisation, class names and widths; the new file read with exactly those feature
columns, the label column optional), ``fit`` has nothing to do (the parameters are restored
from the run's best checkpoint when ``--early-stopping`` kept one, else the latest; only the
run's own steps, never another run's or a stray one), ``report`` writes one row per input
row: ``row``, ``predicted_label`` and ``p_<class>`` per class, and with labels present the
accuracy and the confusion matrix. The summary names the step and epoch really loaded.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise import data
from jaxwise._shared._checks import UserError, missing_path
from jaxwise.checkpoint import CheckpointError, latest_step, load_metadata
from jaxwise.cli._jobs import _common as C
from jaxwise.cli._jobs._cache import CompileTally, default_cache_dir, persistent_cache
from jaxwise.cli._jobs._outputs import OutputFile, hold_for_tests, locked_reader
from jaxwise.models import init_mlp
from jaxwise.train import TrainState

__all__ = ["PredictConfig", "run_predict"]


@dataclasses.dataclass(frozen=True)
class PredictConfig:
    """Settings of ``jaxwise predict``.

    Attributes:
        run_dir: the directory of a ``jaxwise train`` run.
        path: the CSV of rows to predict (the run's feature columns; label optional).
        out: the predictions CSV to write.
        force: overwrite ``out`` if it exists.
        drop_na: drop rows with missing cells (counted) instead of failing.
        cache: use the persistent compilation cache.
        cache_dir: its directory (``None``: `default_cache_dir`).
    """

    run_dir: str
    path: str
    out: str
    force: bool = False
    drop_na: bool = False
    cache: bool = True
    cache_dir: str | None = None


def run_predict(cfg: PredictConfig) -> dict[str, Any]:
    """Predict every row of ``cfg.path`` with the run in ``cfg.run_dir``.

    Args:
        cfg: the settings.

    Returns:
        The JSON-ready summary (rows, accuracy when labels are present, outputs).

    Raises:
        UserError: a bad option, an unusable file or run directory, a run of another job,
            or an existing output without ``force``.
    """
    t_start = time.perf_counter()
    run_dir = Path(cfg.run_dir)
    if not run_dir.is_dir():
        problem = missing_path(run_dir) or "not a directory"
        problem = "no such directory" if problem == "no such file" else problem
        raise UserError(
            f"RUN_DIR {run_dir}: {problem} (give the --out directory of a `jaxwise train` run)"
        )
    cache_dir = (
        (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()) if cfg.cache else None
    )
    with (
        OutputFile(cfg.out, "--out", cfg.force) as target,
        locked_reader(run_dir, "RUN_DIR") as marker,
        persistent_cache(cache_dir) as cache_dir,
    ):
        hold_for_tests()
        run_id = _check_run_dir(run_dir, marker)
        ckpt, meta = _checkpoint(run_dir, run_id)
        features, y = prepare(cfg, meta)
        params, meta = _restore(ckpt, meta, run_id)
        tally = CompileTally()
        with tally.measure():
            probs = C.predict_proba(params)(_standardise(features.x, meta))
        return report(
            cfg, target, meta, features, y, probs, tally, cache_dir, time.perf_counter() - t_start
        )


def _check_run_dir(run_dir: Path, marker: dict[str, Any] | None) -> str | None:
    """The run's id from its marker (None for a run of an older jaxwise); a train run only."""
    if marker is None:
        return None
    job = marker.get("job")
    if job not in (None, "train"):
        raise UserError(
            f"RUN_DIR {run_dir} holds a `jaxwise {job}` run, not a `jaxwise train` run; give the "
            "--out directory of a `jaxwise train` run"
        )
    run_id = marker.get("run_id")
    return run_id if isinstance(run_id, str) and run_id else None


def _checkpoint(run_dir: Path, run_id: str | None) -> tuple[Path, dict[str, Any]]:
    problems = []
    for name in ("best", "checkpoint"):
        if latest_step(run_dir / name, run_id=run_id) is not None:
            meta = load_metadata(run_dir / name, run_id=run_id)
            if not {"feature_names", "classes", "mean", "std", "config"} <= set(meta):
                raise UserError(
                    f"RUN_DIR {run_dir}: the checkpoint lacks the run's feature names and "
                    "standardisation (written by an older jaxwise?); train the run again"
                )
            return run_dir / name, meta
        try:
            load_metadata(run_dir / name, run_id=run_id)
        except CheckpointError as err:
            if ": " in str(err):  # steps exist, none usable: each one named
                problems.append(f"{run_dir / name}: {str(err).split(': ', 1)[1]}")
    if problems:
        raise UserError(
            f"RUN_DIR {run_dir}: the checkpoint is damaged or not this run's; {'; '.join(problems)}"
        )
    raise UserError(
        f"RUN_DIR {run_dir}: no checkpoint (expected {run_dir / 'checkpoint'} from `jaxwise train`)"
    )


def prepare(cfg: PredictConfig, meta: dict[str, Any]) -> tuple[data.Features, np.ndarray | None]:
    """The new rows with the run's feature columns; labels as class indices when present."""
    label = meta.get("label") or meta["config"].get("label")
    try:
        features = data.load_features(
            cfg.path, tuple(meta["feature_names"]), label=label, drop_na=cfg.drop_na
        )
    except data.DataError as err:
        raise UserError(str(err)) from None
    if features.labels is None:
        return features, None
    classes = list(meta["classes"])
    index = {c: i for i, c in enumerate(classes)}
    unknown = sorted(set(features.labels) - set(index))
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (" …" if len(unknown) > 5 else "")
        raise UserError(
            f"{cfg.path}: label column {label!r} has class(es) the run never saw: {shown}; "
            f"known classes: {', '.join(classes[:10])}" + (" …" if len(classes) > 10 else "")
        )
    return features, np.asarray([index[v] for v in features.labels], np.int32)


def _epoch(meta: dict[str, Any]) -> int | None:
    """The epoch of the checkpoint: a best one's (and an older run's) top-level ``epoch``,
    else `fit`'s batch count (one batch per epoch)."""
    if meta.get("epoch") is not None:
        return meta["epoch"]
    record = meta.get("fit")
    return record.get("batches") if isinstance(record, dict) else None


def _standardise(x: np.ndarray, meta: dict[str, Any]) -> np.ndarray:
    mean, std = np.asarray(meta["mean"], np.float64), np.asarray(meta["std"], np.float64)
    z = ((x.astype(np.float64) - mean) / std).astype(np.float32)
    if not np.isfinite(z).all():
        raise UserError(
            "the standardised features are not finite in float32; the new rows are far outside "
            "the training data's range"
        )
    return z


def _restore(ckpt: Path, meta: dict[str, Any], run_id: str | None) -> tuple[Any, dict[str, Any]]:
    """(parameters, metadata) of the step really restored (an older one if the newest is
    damaged, said in one line on stderr)."""
    sizes = (
        len(meta["feature_names"]),
        *meta.get("hidden", meta["config"]["hidden"]),
        len(meta["classes"]),
    )
    tx, _ = C.make_optimizer(2, 1e-3, 1e-4, 0, 1e-5)  # structure only: the values are restored
    key = jax.random.key(0)
    like = TrainState.create(init_mlp(key, sizes), tx, key)
    state, restored_meta = C.restore_reporting(ckpt, like, run_id)
    return state.params, restored_meta


def report(
    cfg: PredictConfig,
    target: OutputFile,
    meta: dict[str, Any],
    features: data.Features,
    y: np.ndarray | None,
    probs: np.ndarray,
    tally: CompileTally,
    cache_dir: Path | None,
    total_seconds: float,
) -> dict[str, Any]:
    """The predictions CSV and the summary (accuracy and confusion matrix with labels)."""
    classes = [str(c) for c in meta["classes"]]
    pred = probs.argmax(1)
    columns = ["row", "predicted_label", *(f"p_{c}" for c in classes)]
    rows = [
        {
            "row": int(r),
            "predicted_label": classes[int(k)],
            **{f"p_{c}": float(v) for c, v in zip(classes, p)},
        }
        for r, k, p in zip(features.rows, pred, probs)
    ]
    target.write_csv(rows, columns)
    summary: dict[str, Any] = {
        "schema": 1,
        "job": "predict",
        "run_dir": str(cfg.run_dir),
        "checkpoint_epoch": _epoch(meta),
        "rows": len(rows),
        "dropped_rows": features.dropped,
        "blank_lines": features.blank_lines,
        "classes": classes,
        "compiles": tally.total,
        "compile": tally.as_dict(cache_dir),
        "timings": {"total_s": total_seconds, "compile_s": tally.seconds},
        "outputs": {"predictions": str(target.path)},
    }
    if y is not None:
        matrix = np.zeros((len(classes), len(classes)), np.int64)
        np.add.at(matrix, (y, pred), 1)
        summary.update(accuracy=float((pred == y).mean()), confusion_matrix=matrix)
    return C.jsonable(summary)

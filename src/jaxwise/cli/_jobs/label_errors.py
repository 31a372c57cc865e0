"""``jaxwise label-errors``: rank the rows of a CSV by how likely their label is wrong.

Phases: ``prepare`` (the CSV, the suspects file checked first: never replaced without
``--force``, never a directory), ``fit`` (the MLP of ``train``, no checkpoint: the job can be
re-run with the same ``--run-dir``), ``rank`` (``--method oof``: rows ranked by out-of-fold
``p(given)`` and confident learning's estimate of how many are wrong, from
`jaxwise.label_errors`, timed and counted apart from the final model; ``--method
gradnorm``: per-example gradient norms of the trained model — kept as a column either way),
``report``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import UserError
from jaxwise.cli._jobs import _common as C
from jaxwise.cli._jobs import tabular
from jaxwise.cli._jobs._cache import CompileTally, default_cache_dir, persistent_cache
from jaxwise.cli._jobs._fitting import LOG_DIRS
from jaxwise.cli._jobs._outputs import SUMMARY, OutputFile, hold_for_tests, write_summary
from jaxwise.cli._jobs._overlap import overlapped

__all__ = ["COLUMNS", "METHODS", "run_label_errors"]

METHODS = ("oof", "gradnorm")
COLUMNS = (
    "row",
    "given_label",
    "predicted_label",
    "p_given",
    "grad_norm",
    "loss",
    "suggested_label",
)
RUN_OUTPUTS = (
    "metrics.jsonl",
    "loss.png",
    "curves.png",
    "confusion.png",
    SUMMARY,
    *LOG_DIRS.values(),
)
DEFAULT_TOP = 20  # --top of --method gradnorm (no estimate of the number of wrong labels)


def run_label_errors(
    cfg: tabular.TabularConfig,
    top: int | None,
    suspects_csv: str | os.PathLike[str],
    *,
    method: str = "oof",
    force: bool = False,
    folds: int = 5,
) -> dict[str, Any]:
    """Train as ``run_train``, then write the ``top`` most suspicious rows to ``suspects_csv``.

    Columns: ``row`` (0-based data row of the file), ``given_label``, ``predicted_label``,
    ``p_given`` (out-of-fold with ``oof``), ``grad_norm`` (the final model's per-example
    gradient norm), ``loss``, ``suggested_label`` (the most probable other class).

    ``top=None``: with ``oof``, confident learning's estimate of how many labels are wrong
    (``num_issues``); with ``gradnorm``, 20. The final model (``--hidden``, ``--epochs``,
    ``--batch-size``, ``--lr``) gives the accuracy and the gradient norms; the out-of-fold
    models use `jaxwise.label_errors.find_label_errors`' size-dependent defaults on the raw
    features (standardised inside each fold). The summary reports the out-of-fold phase
    (``oof``: compilations and seconds) apart from the final model (``final_model``).

    Args:
        cfg: the training settings.
        top: how many rows to write (``None``: see above).
        suspects_csv: the CSV to write.
        method: ``"oof"`` (out-of-fold confident learning) or ``"gradnorm"``.
        force: overwrite ``suspects_csv`` if it exists.
        folds: folds of the out-of-fold phase.

    Returns:
        The JSON-ready summary of ``run_train`` plus ``method`` and the ``suspects`` rows.

    Raises:
        UserError: a bad option, an unusable file, or an existing output without ``force``.
    """
    cfg = dataclasses.replace(
        cfg, checkpoint=False, resume=False, stop_after=None, out_option="--run-dir", force=force
    )
    cfg.validate()
    if top is not None:
        top = C.option_int(top, "--top", min_value=1)
    folds = C.option_int(folds, "--folds", min_value=2, max_value=50)
    if method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    t_start = time.perf_counter()
    cache_dir = (
        (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()) if cfg.cache else None
    )
    with (
        OutputFile(suspects_csv, "--out", force) as target,
        tabular.run_dir(cfg, RUN_OUTPUTS, "label-errors") as out,
        persistent_cache(cache_dir) as cache_dir,
        overlapped() as background,
    ):
        hold_for_tests()
        prep = tabular.prepare(cfg, out)
        t_fit = time.perf_counter()
        fitted = tabular.fit(prep, background)
        tabular.verify(prep, fitted)
        final_seconds = time.perf_counter() - t_fit
        ranking = rank(prep, fitted, method, top, folds, cache_dir)
        target.write_csv(ranking.rows, COLUMNS)
        summary = tabular.report(prep, fitted, time.perf_counter() - t_start, cache_dir)
        summary = _with_ranking(summary, method, ranking, fitted, final_seconds, target.path)
        write_summary(out, summary)
    return summary


def _with_ranking(
    summary: dict[str, Any],
    method: str,
    ranking: Ranking,
    fitted: Any,
    final_seconds: float,
    suspects: Path,
) -> dict[str, Any]:
    """``run_train``'s summary with the suspects, the method and the final model's phase."""
    extra: dict[str, Any] = {
        "job": "label-errors",
        "method": method,
        "top": len(ranking.rows),
        "num_issues": ranking.num_issues,
        "suspects": ranking.rows,
        "final_model": {
            "compiles": fitted.tally.total,
            "seconds": final_seconds,
            "compile_seconds": fitted.tally.seconds,
        },
        "outputs": dict(summary["outputs"], suspects=str(suspects)),
    }
    if ranking.oof is not None:
        extra["oof"] = ranking.oof
    return C.jsonable(dict(summary, **extra))


@dataclasses.dataclass
class Ranking:
    """What `rank` found: the suspects' rows, the estimate, the out-of-fold phase."""

    rows: list[dict[str, Any]]
    num_issues: int | None
    oof: dict[str, Any] | None


def _grad_norms(params: Any, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from jaxwise.per_example import per_example_grad_norms

    return np.asarray(
        per_example_grad_norms(
            C.per_example_loss(), params, (jnp.asarray(x), jnp.asarray(y)), method="ghost"
        ),
        np.float64,
    )


def _oof(prep: tabular.Prepared, folds: int, cache_dir: Path | None) -> tuple[Any, dict[str, Any]]:
    """The out-of-fold ranking of `jaxwise.label_errors` and its phase report."""
    from jaxwise.label_errors import Folds, find_label_errors

    cfg = prep.cfg
    if len(prep.table.y) < 2 * folds:
        raise UserError(
            f"--method oof needs at least 2 rows per fold ({2 * folds} for --folds {folds}); "
            f"{cfg.path} has {len(prep.table.y)}"
        )
    tally = CompileTally()
    start = time.perf_counter()
    try:
        with tally.measure():
            issues = find_label_errors(
                prep.table.x,
                prep.table.y,
                folds=Folds(folds),
                num_classes=len(prep.table.classes),
                seed=cfg.seed,
            )
    except ValueError as err:
        message = str(err).replace("`Folds.n_splits`=", "--folds ").replace("`", "")
        raise UserError(f"--method oof: {message}") from None
    phase = {
        "compiles": tally.total,
        "compiled": tally.compiled,
        "loaded_from_cache": tally.loaded,
        "seconds": time.perf_counter() - start,
        "compile_seconds": tally.seconds,
    }
    return issues, phase


def rank(
    prep: tabular.Prepared,
    fitted: tabular.Fitted,
    method: str,
    top: int | None,
    folds: int,
    cache_dir: Path | None = None,
) -> Ranking:
    """The ``top`` most suspicious rows (dicts with `COLUMNS`), most suspicious first."""
    table = prep.table
    norms = _grad_norms(fitted.params, prep.x_all, table.y)
    if method == "oof":
        issues, phase = _oof(prep, folds, cache_dir)
        count = min(issues.num_issues if top is None else top, len(table.y))
        idx, probs, num_issues = issues.indices[:count], issues.pred_probs, issues.num_issues
    else:
        count = min(DEFAULT_TOP if top is None else top, len(table.y))
        idx, probs, num_issues, phase = np.argsort(-norms, kind="stable")[:count], None, None, None
    p = (
        probs[idx]
        if probs is not None
        else C.predict_proba(fitted.params)(prep.x_all[idx]).astype(np.float64)
    )
    rows = []
    for j, i in enumerate(idx):
        given = int(table.y[i])
        other = p[j].copy()
        other[given] = -1.0
        rows.append(
            {
                "row": int(table.rows[i]),
                "given_label": table.classes[given],
                "predicted_label": table.classes[int(p[j].argmax())],
                "p_given": float(p[j][given]),
                "grad_norm": float(norms[i]),
                "loss": float(-np.log(max(float(p[j][given]), 1e-45))),
                "suggested_label": table.classes[int(other.argmax())],
            }
        )
    return Ranking(rows, num_issues, phase)

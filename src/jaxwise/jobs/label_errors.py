"""``jaxwise label-errors``: rank the rows of a CSV by how likely their label is wrong.

Phases: ``prepare`` (the CSV, the suspects file checked first: never replaced without
``--force``, never a directory), ``fit`` (the MLP of ``train``, no checkpoint: the job can be
re-run with the same ``--run-dir``), ``rank`` (``--method oof``: out-of-fold probabilities and
confident learning from :mod:`jaxwise.label_errors`; ``--method gradnorm``: per-example
gradient norms of the trained model — kept as a column either way), ``report``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np

from jaxwise._checks import UserError
from jaxwise.jobs import _common as C
from jaxwise.jobs import tabular
from jaxwise.jobs._cache import default_cache_dir, persistent_cache
from jaxwise.jobs._outputs import OutputFile, hold_for_tests

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
RUN_OUTPUTS = ("metrics.jsonl", "loss.png", "curves.png", "confusion.png")


def run_label_errors(
    cfg: tabular.TabularConfig,
    top: int,
    suspects_csv: str | os.PathLike[str],
    *,
    method: str = "oof",
    force: bool = False,
    folds: int = 5,
) -> dict[str, Any]:
    """Train as ``run_train``, then write the ``top`` most suspicious rows to ``suspects_csv``.

    Columns: ``row`` (0-based data row), ``given_label``, ``predicted_label``, ``p_given``
    (out-of-fold with ``oof``), ``grad_norm`` (the trained model's per-example gradient
    norm), ``loss``, ``suggested_label`` (the most probable other class).
    """
    cfg = dataclasses.replace(
        cfg, checkpoint=False, resume=False, stop_after=None, out_option="--run-dir", force=force
    )
    cfg.validate()
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
    ):
        hold_for_tests()
        prep = tabular.prepare(cfg, out)
        fitted = tabular.fit(prep)
        tabular.verify(prep, fitted)
        rows = rank(prep, fitted, method, min(top, len(prep.table.y)), folds)
        target.write_csv(rows, COLUMNS)
        summary = tabular.report(prep, fitted, time.perf_counter() - t_start, cache_dir)
    return C.jsonable(
        dict(
            summary,
            job="label-errors",
            method=method,
            suspects=rows,
            outputs=dict(summary["outputs"], suspects=str(target.path)),
        )
    )


def _grad_norms(params: Any, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    from jaxwise.per_example import per_example_grad_norms

    return np.asarray(
        per_example_grad_norms(
            C.per_example_loss(), params, (jnp.asarray(x), jnp.asarray(y)), method="ghost"
        ),
        np.float64,
    )


def _oof(prep: tabular.Prepared, folds: int) -> tuple[np.ndarray, np.ndarray]:
    """(rows, most suspicious first; out-of-fold probabilities) from :mod:`jaxwise.label_errors`."""
    try:
        from jaxwise.label_errors import find_label_errors
    except ModuleNotFoundError as err:
        if err.name != "jaxwise.label_errors":
            raise
        raise UserError(
            "--method oof needs jaxwise.label_errors, which this installation lacks; "
            "use --method gradnorm"
        ) from None
    cfg = prep.cfg
    if len(prep.table.y) < folds:
        raise UserError(
            f"--method oof needs at least --folds ({folds}) rows; "
            f"{cfg.path} has {len(prep.table.y)}"
        )
    try:
        issues = find_label_errors(
            prep.x_all,
            prep.table.y,
            num_classes=len(prep.table.classes),
            hidden=cfg.hidden,
            folds=folds,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,  # None: the module's measured default
            seed=cfg.seed,
        )
    except ValueError as err:
        raise UserError(f"--method oof: {str(err).replace('`', '')}") from None
    found: Any = issues
    probs = getattr(found, "pred_probs", None)
    if probs is None:  # an older form of the module: one out-of-fold run attached
        probs = found.oof.probs
    return np.asarray(issues.indices), np.asarray(probs, np.float64)


def rank(
    prep: tabular.Prepared, fitted: tabular.Fitted, method: str, top: int, folds: int
) -> list[dict[str, Any]]:
    """The ``top`` most suspicious rows, as dicts with :data:`COLUMNS`."""
    table = prep.table
    norms = _grad_norms(fitted.params, prep.x_all, table.y)
    if method == "oof":
        order, probs = _oof(prep, folds)
        idx = order[:top]
    else:
        idx = np.argsort(-norms, kind="stable")[:top]
        probs = None
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
    return rows

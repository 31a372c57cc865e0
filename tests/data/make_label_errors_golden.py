"""Writes tests/data/label_errors_golden-jax<version>.npz: ``find_label_errors`` before grouping.

Run once against jaxwise at commit 404afb0 (17 keyword parameters, issue 44):

    git archive 404afb0 src | tar -x -C /tmp/old
    PYTHONPATH=/tmp/old/src python tests/data/make_label_errors_golden.py

`tests/test_label_errors_options.py` checks that the grouped options (``MLP``, ``Folds``,
``Training``, ``Scoring``) rank the same rows with the same scores: the default call and one
call that sets every old keyword to a non-default value.
"""

import sys
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax

from jaxwise.data import flip_labels, make_blobs
from jaxwise.models import init_mlp


def data() -> tuple[np.ndarray, np.ndarray]:
    """90 rows, 2 features, 3 classes, 6 labels flipped (fixed seeds)."""
    x, y = make_blobs(90, n_features=2, n_classes=3, seed=2)
    noisy, _ = flip_labels(y, 6, 3, seed=3)
    return np.asarray(x), np.asarray(noisy)


def trained_params():
    """The gradnorm case's "trained" MLP: a fixed initialisation (what it ranks by is the norm)."""
    return init_mlp(jax.random.key(5), (2, 8, 3))


# name -> the old keywords (besides x and y); the test states the same call in the new form
OLD_CALLS: dict[str, dict[str, Any]] = {
    "default": {},
    "options": {
        "num_classes": 4,
        "ranked_by": "normalized_margin",
        "standardize": False,
        "hidden": (16, 8),
        "folds": 3,
        "repeats": 2,
        "epochs": 7,
        "batch_size": 16,
        "optimizer": optax.sgd(0.1),
        "patience": None,
        "seed": 4,
    },
    "gradnorm": {"method": "gradnorm", "params": "trained_params"},
}
FIELDS = ("indices", "score", "p_given", "suggested", "flagged", "pred_probs")


def main() -> None:
    from jaxwise.label_errors import find_label_errors

    x, y = data()
    arrays = {}
    for name, kwargs in OLD_CALLS.items():
        call: dict[str, Any] = {
            k: trained_params() if v == "trained_params" else v for k, v in kwargs.items()
        }
        issues = find_label_errors(x, y, **call)
        for field in FIELDS:
            arrays[f"{name}/{field}"] = np.asarray(getattr(issues, field))
        arrays[f"{name}/num_issues"] = np.asarray(issues.num_issues)
        arrays[f"{name}/best_epoch"] = np.asarray([run.best_epoch for run in issues.oof])
    default = Path(__file__).with_name(f"label_errors_golden-jax{jax.__version__}.npz")
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    np.savez_compressed(target, **arrays)
    print(f"wrote {target} ({len(arrays)} arrays) with jax {jax.__version__}")


if __name__ == "__main__":
    main()

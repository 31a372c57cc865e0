"""The CLI's jobs as functions: the spiral demo, training, predicting, finding label errors.

Each job returns a JSON-ready summary dict (strict JSON: no NaN/Infinity, ``"schema": 1``);
`jaxwise.cli` parses arguments and prints. Every job runs in named phases — ``prepare``
(options, data, output paths: all checked before any work), ``fit``, ``verify``, ``report``.
Problems with the user's input raise `UserError` (one line; the CLI exits with code 2)
before anything is written, and nothing already on disk that jaxwise did not write is
overwritten; a run that produced no usable model raises `RunFailed` (exit code 1).

Examples:
    >>> cfg = SpiralConfig(epochs=2, n_per_class=60, out=None, progress=False, cache=False)
    >>> summary = run_spiral(cfg)
    >>> summary["compiles"], 0.0 <= summary["test_accuracy"] <= 1.0
    (1, True)
"""

from jaxwise._checks import UserError
from jaxwise.jobs._cache import CompileTally, default_cache_dir, persistent_cache
from jaxwise.jobs._common import RunFailed, make_optimizer
from jaxwise.jobs.label_errors import run_label_errors
from jaxwise.jobs.predict import PredictConfig, run_predict
from jaxwise.jobs.spiral import SpiralConfig, run_spiral
from jaxwise.jobs.tabular import TabularConfig, run_train

__all__ = [
    "CompileTally",
    "PredictConfig",
    "RunFailed",
    "SpiralConfig",
    "TabularConfig",
    "UserError",
    "default_cache_dir",
    "make_optimizer",
    "persistent_cache",
    "run_label_errors",
    "run_predict",
    "run_spiral",
    "run_train",
]

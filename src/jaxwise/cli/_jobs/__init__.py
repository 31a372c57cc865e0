"""The CLI's jobs as functions: the spiral demo, training, predicting, finding label errors.

Private to the command line (public as ``jaxwise.jobs`` until the sixth round): from Python,
run a command with ``jaxwise.cli.main([...])``.

Each job returns a JSON-ready summary dict (strict JSON: no NaN/Infinity, ``"schema": 1``);
`jaxwise.cli` parses arguments and prints. Every job runs in named phases — ``prepare``
(options, data, output paths: all checked before any work), ``fit``, ``verify``, ``report``.
Problems with the user's input raise `UserError` (one line; the CLI exits with code 2)
before anything is written, and nothing already on disk that jaxwise did not write is
overwritten; a run that produced no usable model raises `RunFailed` (exit code 1).
Each job's module is imported on first use (``jaxwise spiral`` does not import the CSV jobs).

Examples:
    >>> from jaxwise.cli._jobs import SpiralConfig, run_spiral
    >>> cfg = SpiralConfig(epochs=2, n_per_class=60, out=None, progress=False, cache=False)
    >>> summary = run_spiral(cfg)
    >>> summary["compiles"], 0.0 <= summary["test_accuracy"] <= 1.0
    (1, True)
"""

import importlib as _importlib
import typing as _typing

from jaxwise._errors import UserError

if _typing.TYPE_CHECKING:
    from jaxwise.cli._jobs._cache import CompileTally, default_cache_dir, persistent_cache
    from jaxwise.cli._jobs._common import RunFailed, make_optimizer
    from jaxwise.cli._jobs.label_errors import run_label_errors
    from jaxwise.cli._jobs.predict import PredictConfig, run_predict
    from jaxwise.cli._jobs.spiral import SpiralConfig, run_spiral
    from jaxwise.cli._jobs.tabular import TabularConfig, run_train

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

_HOMES = {  # name -> the module that defines it (imported on first use)
    "CompileTally": "_cache",
    "default_cache_dir": "_cache",
    "persistent_cache": "_cache",
    "RunFailed": "_common",
    "make_optimizer": "_common",
    "run_label_errors": "label_errors",
    "PredictConfig": "predict",
    "run_predict": "predict",
    "SpiralConfig": "spiral",
    "run_spiral": "spiral",
    "TabularConfig": "tabular",
    "run_train": "tabular",
}


_JOBS = ("label_errors", "predict", "spiral", "tabular")  # the jobs' own modules


def __getattr__(name: str) -> _typing.Any:
    if name in _HOMES:
        value = getattr(_importlib.import_module(f"jaxwise.cli._jobs.{_HOMES[name]}"), name)
    elif name in _JOBS:
        value = _importlib.import_module(f"jaxwise.cli._jobs.{name}")
    else:
        raise AttributeError(f"module 'jaxwise.cli._jobs' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*__all__, *_JOBS])

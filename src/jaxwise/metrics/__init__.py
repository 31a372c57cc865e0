"""Where a run's scalars go: JSON lines, TensorBoard event files, an MLflow run.

A `MetricWriter` has ``write(step, scalars)``, ``flush()`` and ``close()``;
[`train.fit`][jaxwise.train.fit] writes every logged step to each of its ``writers`` and the
CLI's ``--log jsonl,tensorboard,mlflow`` picks them. A resumed run continues every writer with
no step twice and none missing. `TensorBoardWriter` needs the ``tensorboard`` extra,
`MLflowWriter` the ``mlflow`` extra; `JsonlWriter` needs nothing.

Examples:
    >>> import tempfile, pathlib
    >>> from jaxwise.metrics import JsonlWriter, MetricWriter
    >>> w = JsonlWriter(pathlib.Path(tempfile.mkdtemp()) / "metrics.jsonl")
    >>> isinstance(w, MetricWriter)
    True
"""

from jaxwise.metrics._mlflow import MLflowWriter
from jaxwise.metrics._tensorboard import TensorBoardWriter
from jaxwise.metrics._writer import JsonlWriter, MetricWriter

__all__ = ["JsonlWriter", "MLflowWriter", "MetricWriter", "TensorBoardWriter"]

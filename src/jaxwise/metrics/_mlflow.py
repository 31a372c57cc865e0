"""`MLflowWriter`: scalars as MLflow metrics of one run (a local file store by default)."""

from __future__ import annotations

import os
import posixpath
import re
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from jaxwise._shared._checks import check_path
from jaxwise._shared._extras import require
from jaxwise.metrics._writer import check_scalars

__all__ = ["MLflowWriter"]

_TAG = "jaxwise.run_id"
_BATCH = 1000  # MLflow's limit of metrics per log_batch
_MAX_NAME = 250  # MLflow's limit on a metric name's length
# MLflow's metric names: alphanumerics, `_`, `-`, `.`, space, `/` (and `:` except on Windows).
_NAME = re.compile(r"[/\w.\- ]*" if sys.platform == "win32" else r"[/\w.\- :]*")


def _uri(tracking: str | os.PathLike[str]) -> str:
    """A tracking URI: a URI (``"file:…"``, ``"http://…"``) as is, a path as its file store.

    A path (or ``file:`` URI) naming something that is not a directory is refused here,
    before MLflow tries to make its ``.trash`` inside it.
    """
    if isinstance(tracking, str) and "://" in tracking or str(tracking).startswith("file:"):
        uri = str(tracking)
        if uri.startswith("file:"):
            from urllib.parse import unquote, urlparse

            _check_store_dir(Path(unquote(urlparse(uri).path)), tracking)
        return uri
    path = Path(check_path(tracking, "tracking_uri")).resolve()
    _check_store_dir(path, tracking)
    return path.as_uri()


def _check_store_dir(path: Path, given: object) -> None:
    if path.exists() and not path.is_dir():
        raise ValueError(
            f"`tracking_uri` must be a directory (MLflow's file store) or a tracking URI, "
            f"got {str(given)!r}, which is a file"
        )


def check_metric_name(name: str) -> None:
    """Refuse a metric name MLflow would reject at ``log_batch`` (so ``flush`` cannot fail).

    >>> check_metric_name("acc@1")
    Traceback (most recent call last):
    ...
    ValueError: metric name 'acc@1' is not accepted by MLflow: ...
    """
    why = ""
    if len(name) > _MAX_NAME:
        why = f"it is {len(name)} characters long (at most {_MAX_NAME})"
    elif not _NAME.fullmatch(name):
        bad = sorted({c for c in name if not _NAME.fullmatch(c)})
        why = (
            f"it contains {''.join(bad)!r}; names may only contain alphanumerics, "
            "underscores, dashes, periods, spaces, slashes"
            + ("" if sys.platform == "win32" else " and colons")
        )
    else:
        norm = posixpath.normpath(name)
        if norm != name or norm == "." or norm.startswith(("..", "/")):
            why = f"as a path it resolves to {norm!r} (MLflow stores metrics as files)"
    if why:
        raise ValueError(
            f"metric name {name!r} is not accepted by MLflow: {why}; rename it "
            "(e.g. 'acc@1' -> 'acc_at_1') before passing it to `MLflowWriter.write`"
        )


def _filter(run_name: str) -> str | None:
    """An MLflow filter string matching ``run_name`` in the tag, or None (no quote fits)."""
    for quote in ("'", '"'):
        if quote not in run_name:
            return f"tags.`{_TAG}` = {quote}{run_name}{quote}"
    return None


class MLflowWriter:
    """Scalars as the metrics of one MLflow run (``mlflow ui --backend-store-uri URI`` shows it).

    The run is found by its ``run_name`` (kept as the tag ``jaxwise.run_id``): a writer opened
    with the name of an existing run continues it (a resumed run keeps its MLflow run id);
    otherwise a new run is created. MLflow's metric history is append-only, so a continued
    run skips, metric by metric, the steps it already holds (those a killed process logged
    after its last checkpoint keep their first values): no step is logged twice, and a metric
    new to the run is logged from the first step written. A metric name MLflow refuses
    (``"acc@1"``) is refused at ``write`` with a ``ValueError`` naming it. Metrics are sent in
    batches (``log_batch``) at ``flush``/``close`` and every 1000 values. Needs the ``mlflow``
    extra (mlflow-skinny).

    A directory is MLflow's file store, which MLflow 3 serves only with
    ``MLFLOW_ALLOW_FILE_STORE=true`` (set by this writer for its process when unset; set it
    for ``mlflow ui`` too), or pass a database URI such as ``"sqlite:///mlflow.db"``.

    Args:
        tracking_uri: a directory (a local file store there, created) or an MLflow tracking
            URI.
        run_name: the run's name; the same name continues the same run.
        experiment: the experiment (created when missing).
        params: logged once as the run's parameters when the run is created.

    Attributes:
        run_id: the MLflow run id.

    Examples:
        >>> import tempfile
        >>> with MLflowWriter(tempfile.mkdtemp(), run_name="demo") as w:
        ...     w.write(1, {"loss": 0.5})
    """

    def __init__(
        self,
        tracking_uri: str | os.PathLike[str],
        *,
        run_name: str,
        experiment: str = "jaxwise",
        params: Mapping[str, object] | None = None,
    ) -> None:
        for name, value in (("run_name", run_name), ("experiment", experiment)):
            if not isinstance(value, str) or not value:
                raise TypeError(f"`{name}` must be a non-empty string, got {value!r}")
        if params is not None and not isinstance(params, Mapping):
            raise TypeError(f"`params` must be a mapping, got {type(params).__name__}")
        self.tracking_uri = _uri(tracking_uri)
        if self.tracking_uri.startswith("file:"):  # MLflow 3 keeps its file store behind a flag
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        tracking = require(
            "mlflow.tracking", extra="mlflow", feature="jaxwise.metrics.MLflowWriter"
        )
        self._entities = require("mlflow.entities", extra="mlflow")
        self._client: Any = tracking.MlflowClient(tracking_uri=self.tracking_uri)
        self.run_id, self._done = self._find_or_create(run_name, experiment, params or {})
        self._pending: list[Any] = []
        self._closed = False

    def _find_or_create(
        self, run_name: str, experiment: str, params: Mapping[str, object]
    ) -> tuple[str, dict[str, int]]:
        """The run's id and the last step it holds of each metric (empty for a new run)."""
        client = self._client
        found = client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found is not None else client.create_experiment(experiment)
        run = self._find(exp_id, run_name)
        if run is not None:
            done: dict[str, int] = {}
            for key in run.data.metrics:
                history = client.get_metric_history(run.info.run_id, key)
                done[key] = max((m.step for m in history), default=-1)
            return run.info.run_id, done
        run = client.create_run(exp_id, run_name=run_name, tags={_TAG: run_name})
        param_list = [self._entities.Param(str(k), str(v)) for k, v in params.items()]
        if param_list:
            client.log_batch(run.info.run_id, params=param_list)
        return run.info.run_id, {}

    def _find(self, exp_id: str, run_name: str) -> Any:
        """The run tagged ``run_name`` in the experiment, or None."""
        query = _filter(run_name)
        if query is not None:
            runs = self._client.search_runs([exp_id], filter_string=query)
            return runs[0] if runs else None
        token = None  # a name holding both quotes: compare the tags here, page by page
        while True:
            page = self._client.search_runs([exp_id], max_results=1000, page_token=token)
            for run in page:
                if run.data.tags.get(_TAG) == run_name:
                    return run
            token = page.token
            if not token:
                return None

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """Queue ``scalars`` at ``step`` (a metric the run already holds at ``step`` is skipped).

        Args:
            step: the step (an int >= 0).
            scalars: name -> value (anything ``float()`` takes).

        Raises:
            TypeError: ``step`` or an entry of ``scalars`` is not what is expected.
            ValueError: the writer is closed, or a name is one MLflow refuses (``@``, ``%``,
                over 250 characters, ...): refused here so that ``flush`` cannot fail.
        """
        values = check_scalars(step, scalars)
        if self._closed:
            raise ValueError(f"MLflowWriter(run_id={self.run_id!r}) is closed")
        for name in values:
            check_metric_name(name)
        now = int(time.time() * 1000)
        metric = self._entities.Metric
        step = int(step)
        self._pending.extend(
            metric(k, v, now, step) for k, v in values.items() if step > self._done.get(k, -1)
        )
        if len(self._pending) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        """Send the queued metrics to the tracking store."""
        while self._pending:
            batch, self._pending = self._pending[:_BATCH], self._pending[_BATCH:]
            self._client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        """Flush (the run stays open to be continued; idempotent)."""
        if not self._closed:
            self.flush()
        self._closed = True

    def __enter__(self) -> MLflowWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

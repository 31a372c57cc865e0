"""`TensorBoardWriter`: scalars as TensorBoard event files, through tensorboardX (no TensorFlow)."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from jaxwise._shared._checks import check_path
from jaxwise._shared._extras import require
from jaxwise.metrics._writer import check_scalars, claim

__all__ = ["TensorBoardWriter"]


class TensorBoardWriter:
    """Scalars as TensorBoard event files in ``logdir`` (``tensorboard --logdir`` shows them).

    Each step is one event holding every scalar as a tag (``simple_value``), written
    synchronously (``flush`` means on disk: a SIGKILL after it loses nothing). A resumed run
    continues the same ``logdir``: the first ``write`` at step ``s`` opens a new event file
    that starts with TensorBoard's restart marker at ``s`` (``SessionLog.START``, as
    ``purge_step`` does), so TensorBoard's reader drops whatever an earlier (killed) process
    wrote at steps ``>= s``: no step is shown twice. One writer per ``logdir``: a second
    `TensorBoardWriter` there is refused (``ValueError``) until the first is closed, since its
    restart marker would hide the first one's events (an ``flock`` on
    ``<logdir>/.jaxwise-writer.lock``, released on ``close()`` and when its process dies).
    Needs the ``tensorboard`` extra (tensorboardX, for its event-file writer and protos; no
    TensorFlow).

    Args:
        logdir: the directory of the event files (created).

    Examples:
        >>> import tempfile
        >>> with TensorBoardWriter(tempfile.mkdtemp()) as w:
        ...     w.write(1, {"loss": 0.5})
    """

    def __init__(self, logdir: str | os.PathLike[str]) -> None:
        self.logdir = check_path(logdir, "logdir")
        feature = "jaxwise.metrics.TensorBoardWriter"
        self._files = require(
            "tensorboardX.event_file_writer", extra="tensorboard", feature=feature
        )
        self._pb = require("tensorboardX.proto.event_pb2", extra="tensorboard", feature=feature)
        self._summary = require(
            "tensorboardX.proto.summary_pb2", extra="tensorboard", feature=feature
        ).Summary
        self._writer: Any = None
        self._closed = False
        lock_path = self.logdir / ".jaxwise-writer.lock"
        self._lock = claim(self, lock_path, f"TensorBoardWriter({str(self.logdir)!r})")

    def _open(self, step: int) -> Any:
        """A new event file (named after the ones there, so readers order it last)."""
        self.logdir.mkdir(parents=True, exist_ok=True)
        count = sum(1 for p in self.logdir.iterdir() if ".tfevents." in p.name)
        writer = self._files.EventsWriter(str(self.logdir / "events"), f".{count:06d}")
        start = self._pb.SessionLog(status=self._pb.SessionLog.START)
        writer.write_event(self._pb.Event(wall_time=time.time(), step=step, session_log=start))
        return writer

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        """One event at ``step`` (the first write purges what was logged at steps ``>= step``).

        Args:
            step: the step (an int >= 0).
            scalars: name -> value (anything ``float()`` takes).

        Raises:
            TypeError: ``step`` or an entry of ``scalars`` is not what is expected.
            ValueError: the writer is closed.
        """
        values = check_scalars(step, scalars)
        if self._closed:
            raise ValueError(f"TensorBoardWriter({str(self.logdir)!r}) is closed")
        if self._writer is None:
            self._writer = self._open(int(step))
        summary = self._summary(
            value=[self._summary.Value(tag=k, simple_value=v) for k, v in values.items()]
        )
        self._writer.write_event(
            self._pb.Event(wall_time=time.time(), step=int(step), summary=summary)
        )

    def flush(self) -> None:
        """Write the buffered events to the event file."""
        if self._writer is not None:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file; release ``logdir`` for another writer (idempotent)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        self._closed = True
        self._lock.release()

    def __enter__(self) -> TensorBoardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

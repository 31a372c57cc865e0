"""The single writer of a checkpoint directory: atomic, checksummed, locked, asynchronous steps.

In a single process jaxwise writes a step itself, as an orbax pytree item that plain orbax
reads (see ``_native``); in a ``jax.distributed`` job every process writes its shards
through orbax (an orbax pytree item beside the same sealed metadata).
"""

from __future__ import annotations

import functools
import gc
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise._shared._checks import check_int, check_path
from jaxwise._shared._disk import disk_full_error, is_disk_full
from jaxwise._shared._interrupt import signals_held
from jaxwise._shared._lock import describe_holder
from jaxwise._version import __version__
from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint import _native as native
from jaxwise.checkpoint import _safety as safety
from jaxwise.checkpoint._async import SaveQueue, track, untrack
from jaxwise.checkpoint._format import CheckpointError, CheckpointWarning, Damaged
from jaxwise.checkpoint._leaves import check_metadata, jsonable_static, leaf_rows, step_of
from jaxwise.checkpoint._steps import Foreign, check_run_id, read_meta, step_problem

__all__ = ["Checkpointer", "save"]


def _sync(tag: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(tag)


def _lock_everywhere(path: Path) -> fmt.DirLock | None:
    """Process 0 takes the writer lock; in a multi-process job every process learns the outcome."""
    lock, error = None, None
    if jax.process_index() == 0:
        try:
            lock = fmt.DirLock(path)
        except CheckpointError as err:
            error = err
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        failed = multihost_utils.broadcast_one_to_all(np.int32(error is not None))
        if int(failed) and error is None:  # the other processes fail with process 0
            raise CheckpointError(f"checkpoint directory {path} is in use by another writer")
    if error is not None:
        raise error
    return lock


def _snapshot(leaves: list[Any]) -> list[Any]:
    """A copy of the arrays ``leaves`` on their own devices (dispatched asynchronously).

    The copy outlives the donation of the state to the next training step, so a background
    save can read it while training goes on.
    """
    out: list[Any] = [np.array(leaf) if isinstance(leaf, np.ndarray) else leaf for leaf in leaves]
    arrays = [i for i, leaf in enumerate(out) if isinstance(leaf, jax.Array)]
    devices: list[jax.Array] = [out[i] for i in arrays]
    copies = jax.device_put(devices, [a.sharding for a in devices], may_alias=False)
    for i, copy in zip(arrays, copies):
        out[i] = copy
    return out


def _damaged_data(step_dir: Path) -> Damaged | None:
    """Why an intact-looking native step's data is damaged (a leaf failing its CRC), or None.

    `restore` skips such a step and falls back to an older one; a resumed run then saves
    that step number again, so the damaged step must give way (moved aside, never deleted).
    Read only when a save finds its slot taken: never on the normal path.
    """
    try:
        doc = read_meta(step_dir)
        if doc.get("format") in native.FORMATS:
            native.check_data(step_dir, doc)
    except Damaged as err:
        return err
    return None


def writes_natively() -> bool:
    """Whether this process writes jaxwise's single-process format (else through orbax)."""
    return jax.process_count() == 1


def _orbax_item(rows: list[dict[str, Any]], stored: list[Any]) -> dict[str, Any]:
    """The nested tree of a multi-process step (the rows get their device checksums)."""
    for row, checksum in zip(rows, fmt.checksums(stored)):
        row["checksum"] = checksum
    return fmt.nest([(tuple(row["path"]), value) for row, value in zip(rows, stored)])


class Checkpointer:
    """The single writer of a checkpoint directory: ``save`` steps, keep the newest ``keep``.

    Holds an exclusive lock on the directory for its lifetime (in process 0 of a
    ``jax.distributed`` job): a second writer, in this or another process, gets a
    [`CheckpointError`][jaxwise.checkpoint.CheckpointError] at once, naming the process that
    holds it. A step that already exists is never overwritten; only steps older than the one
    just written are deleted (beyond ``keep``, and only this run's), and only after it is
    complete. Every process of a multi-process job must call ``save`` with the same state.

    Saves are asynchronous by default (``async_save=True``): ``save`` copies the state's
    arrays on their devices (an asynchronous copy, so the state can be donated to the next
    step at once) and a background thread checksums and writes them. At most one save is in
    flight: the next ``save`` first waits for it. A failed background save is raised, as a
    [`CheckpointError`][jaxwise.checkpoint.CheckpointError] naming its step (a full disk as
    the ``OSError`` below), by the next ``save``, ``wait`` or ``close``; a save still in
    flight when the program ends (or is interrupted) is completed before the interpreter
    shuts down. In a multi-process job the writes go through orbax's ``AsyncCheckpointer``.
    ``async_save=False`` writes before ``save`` returns.

    With a ``run_id``, every step records it: [`restore`][jaxwise.checkpoint.restore],
    [`latest_step`][jaxwise.checkpoint.latest_step] and
    [`load_metadata`][jaxwise.checkpoint.load_metadata] given the same ``run_id`` never take
    another run's steps, and a step of another run (or a renamed step directory) in the way
    of a new step is moved aside as ``<step>.stray-<n>``. A damaged or incomplete directory
    in the way is moved aside as ``<step>.damaged-<n>``; orbax's temporary directories left
    by a crash are removed when the writer takes the directory.

    A step is written only when the disk has room for it; a full disk is an ``OSError``
    (``errno.ENOSPC``) naming the step, with no temporary files left and the earlier steps
    untouched. SIGINT/SIGTERM arriving during a write are delivered once it is complete.

    Args:
        path: the checkpoint directory (created if missing).
        keep: how many steps to keep, >= 1.
        async_save: write the files in the background.
        run_id: the run the steps belong to (recorded in every step), or ``None``.

    Raises:
        ImportError: orbax is not installed (``pip install 'jaxwise[checkpoint]'``).
        CheckpointError: another writer holds the directory.
        TypeError: ``path`` is not a path, ``keep`` not an int or ``run_id`` not a string.
        ValueError: ``keep < 1``.

    Examples:
        >>> import tempfile, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> from jaxwise.train import TrainState
        >>> state = TrainState.create({"w": jnp.ones(2)}, optim.sgd(0.1), 0)
        >>> with Checkpointer(tempfile.mkdtemp(), keep=2) as ck:
        ...     _ = ck.save(state, {"epoch": 0})
        ...     Checkpointer(ck.path)
        Traceback (most recent call last):
        ...
        jaxwise.checkpoint.CheckpointError: checkpoint directory ... is in use by ...
    """

    def __init__(
        self,
        path: str | Path,
        *,
        keep: int = 3,
        async_save: bool = True,
        run_id: str | None = None,
    ) -> None:
        ocp = fmt.orbax()
        fmt.quiet_orbax()
        check_path(path, "path")
        self.path = Path(path).absolute()
        self.keep = check_int(keep, "keep", min_value=1)
        self.async_save = bool(async_save)
        self.run_id = check_run_id(run_id)
        self._lock = _lock_everywhere(self.path)
        if self._lock is not None and self._lock.stale:
            warnings.warn(
                f"took over the writer lock of {self.path}: {describe_holder(self._lock.stale)} "
                "ended without releasing it",
                CheckpointWarning,
                stacklevel=2,
            )
        if jax.process_index() == 0:
            safety.remove_leftovers(self.path)  # a crashed write's: never a step
        self._native = writes_natively()
        self._writer = None
        if not self._native:
            handler = ocp.CompositeCheckpointHandler()
            several = jax.process_count() > 1
            self._writer = (
                ocp.AsyncCheckpointer(handler)
                if async_save and several
                else ocp.Checkpointer(handler)
            )
        several = jax.process_count() > 1
        self._queue = SaveQueue() if async_save and not several else None
        self._pending: int | None = None
        self._closed = False
        track(self)

    def save(
        self, tree: Any, metadata: dict[str, Any] | None = None, *, step: int | None = None
    ) -> Path:
        """Save the pytree ``tree`` (and JSON ``metadata``) as step ``step``.

        Args:
            tree: any pytree of arrays: a [`TrainState`][jaxwise.train.TrainState], a Flax
                NNX ``nnx.State``, an Equinox model's arrays (``eqx.partition``), a dict.
            metadata: a strict-JSON dict stored with it (no NaN or infinity), or ``None``.
            step: the step number (default: ``int(tree.step)``, a ``TrainState``'s step).

        Returns:
            The step's directory (complete once ``wait`` returns, with ``async_save``).

        Raises:
            CheckpointError: the previous asynchronous save failed, the step exists already
                (this run's), or the checkpointer is closed.
            OSError: the disk is full (``errno.ENOSPC``, naming the step); nothing is left
                of the step and the earlier ones are untouched.
            TypeError: ``tree`` holds a non-array leaf, ``step`` is missing (a tree without
                a ``step`` field) or not an int, or ``metadata`` is not a JSON dict.
            ValueError: ``metadata`` holds a NaN or infinity (named by its key path), or
                ``step < 0``.
        """
        if self._closed:
            raise CheckpointError(f"this Checkpointer of {self.path} is closed")
        step = step_of(tree, step)
        metadata = check_metadata(metadata)
        rows, stored = leaf_rows(tree)
        doc = {
            "jaxwise_version": __version__,
            "step": step,
            "run_id": self.run_id,
            "static": jsonable_static(tree),
            "user": metadata,
        }
        self.wait()
        target = self.path / str(step)
        self._clear_slot(step, target)
        if self._queue is not None:
            write = functools.partial(self._write, rows, _snapshot(stored), doc, target)
            self._queue.submit(step, write)
            return target
        self._write(rows, stored, doc, target)
        return target

    def _write(
        self, rows: list[dict[str, Any]], stored: list[Any], doc: dict[str, Any], target: Path
    ) -> None:
        """Checksum and write one step; then delete steps beyond ``keep``.

        With orbax's ``AsyncCheckpointer`` (several processes) the files are finished, and
        the retention applied, by ``wait``.
        """
        step = doc["step"]
        if self._native:
            data = native.host_bytes(stored)
            size = sum(len(b) for b in data)
            # the leaves, ~1 KB of JSON per leaf (.zarray, _METADATA, _sharding, leaf table)
            # and a block for each of the step's 5 files and 4 directories
            safety.check_space(target, int(size * 1.05) + 1024 * (len(rows) + 8) + 9 * 4096)
            self._clear_slot(step, target)
            with signals_held():
                try:
                    shardings = [native.sharding_of(leaf) for leaf in stored]
                    native.write_step(target, rows, data, doc, shardings)
                except Exception as err:
                    self._failed(step, target, err)
                self._retain(step)
            return
        ocp = fmt.orbax()
        tree = _orbax_item(rows, stored)
        sealed = fmt.seal({**doc, "format": fmt.FORMAT, "leaves": rows})
        safety.check_space(target, safety.needed_bytes(tree, len(json.dumps(sealed))))
        self._clear_slot(step, target)
        args = ocp.args.Composite(
            **{fmt.STATE: ocp.args.StandardSave(tree), fmt.META: ocp.args.JsonSave(sealed)}
        )
        with signals_held():
            self._pending = step
            try:
                assert self._writer is not None
                self._writer.save(target, args=args)
                if not hasattr(self._writer, "wait_until_finished"):  # written: retain now
                    self._pending = None
                    self._retain(step)
            except Exception as err:
                self._failed(step, target, err)

    def _retain(self, step: int) -> None:
        """Delete this run's intact steps older than ``step`` beyond ``keep`` (process 0)."""
        if jax.process_index() == 0:
            older = sorted(
                s
                for s, d in fmt.step_dirs(self.path).items()
                if s < step and step_problem(d, s, self.run_id) is None
            )
            for old in older[: max(0, len(older) - (self.keep - 1))]:
                shutil.rmtree(self.path / str(old), ignore_errors=True)
        _sync(f"jaxwise-checkpoint-done-{step}")

    def _failed(self, step: int, target: Path, err: Exception) -> None:
        """Clean up after a failed write of ``step`` and raise the error (a full disk named)."""
        self._pending = None
        if jax.process_index() == 0:
            safety.remove_leftovers(self.path, step)
        if not is_disk_full(err):
            raise err
        err.__traceback__ = None  # free orbax's abandoned coroutines now, not at exit
        del err
        gc.collect()
        raise disk_full_error(target) from None

    def _clear_slot(self, step: int, target: Path) -> None:
        if target.exists():
            problem = step_problem(target, step, self.run_id)
            bad_data = _damaged_data(target) if problem is None else None
            problem = problem or bad_data
            if problem is None:
                raise CheckpointError(f"a checkpoint for step {step} already exists in {self.path}")
            if jax.process_index() == 0:  # another run's, stray or damaged: kept, out of the way
                kind = "stray" if isinstance(problem, Foreign) else "damaged"
                n = 0
                while target.with_name(f"{step}.{kind}-{n}").exists():
                    n += 1
                aside = target.with_name(f"{step}.{kind}-{n}")
                target.rename(aside)
                if bad_data is not None:  # it looked intact: say why it is moved
                    warnings.warn(
                        f"checkpoint step {step} in {self.path} is damaged ({problem}): moved "
                        f"aside as {aside.name} (kept for inspection) and written again",
                        CheckpointWarning,
                        stacklevel=3,
                    )
        _sync(f"jaxwise-checkpoint-slot-{step}")

    def wait(self) -> None:
        """Block until the save in flight is complete (older steps beyond ``keep`` deleted).

        Raises:
            CheckpointError: that save failed (raised once).
        """
        if self._queue is not None:
            self._queue.wait()
            return
        if self._pending is None:
            return
        finish = getattr(self._writer, "wait_until_finished", None)
        if finish is not None:  # an AsyncCheckpointer
            try:
                with signals_held():
                    finish()
            except Exception as err:
                self._failed(self._pending, self.path / str(self._pending), err)
        step, self._pending = self._pending, None
        self._retain(step)

    def close(self) -> None:
        """Finish the save in flight and release the directory lock (idempotent).

        Raises:
            CheckpointError: the save in flight failed (the lock is released all the same).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self.wait()
        finally:
            untrack(self)
            try:
                if self._writer is not None:
                    self._writer.close()
            finally:
                if self._lock is not None:
                    self._lock.release()
                    self._lock = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def save(
    path: str | Path,
    tree: Any,
    metadata: dict[str, Any] | None = None,
    *,
    step: int | None = None,
    keep: int = 3,
    run_id: str | None = None,
) -> Path:
    """Save the pytree ``tree`` (and JSON ``metadata``) as step ``step`` under ``path``.

    ``path/<step>/state`` is an orbax pytree item of the leaves (nested dicts, typed keys as
    raw key data: ``ocp.StandardCheckpointer().restore(path/<step>/state)`` reads it);
    ``path/<step>/meta/metadata`` the leaf table (paths, shapes, dtypes, a CRC-32 per
    leaf), static fields and ``metadata``, sealed by a digest (in a multi-process job every
    process writes its shards of the state item through orbax). Each step is
    written to a temporary directory and renamed when complete, so an interrupted write
    never harms earlier steps. One-shot form of
    [`Checkpointer`][jaxwise.checkpoint.Checkpointer] (takes the directory's writer lock for
    the duration).

    Args:
        path: the checkpoint directory (created if missing).
        tree: any pytree of arrays, e.g. a [`TrainState`][jaxwise.train.TrainState] (arrays
            may be sharded, also across processes).
        metadata: a strict-JSON dict (e.g. epoch,
            [`data_fingerprint`][jaxwise.checkpoint.data_fingerprint]); NaN and infinity
            are refused.
        step: the step number (default: ``int(tree.step)``).
        keep: how many steps to keep (older ones of the same run are deleted after this one
            is written).
        run_id: the run this step belongs to (recorded in the step; see
            [`Checkpointer`][jaxwise.checkpoint.Checkpointer]).

    Returns:
        The directory of this step's checkpoint.

    Raises:
        CheckpointError: another writer holds the directory, or the step exists already.
        OSError: the disk is full (``errno.ENOSPC``, naming the step; nothing is left of it).
        TypeError: ``tree`` holds a non-array leaf, has no ``step`` and none is given, or
            ``metadata`` is not a JSON dict.
        ValueError: ``metadata`` holds a NaN or infinity (named by its key path).

    Examples:
        >>> import tempfile, jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> params = {"enc.w": jnp.ones(2), "enc": {"w": jnp.zeros(2)}}
        >>> from jaxwise.checkpoint import restore
        >>> from jaxwise.train import TrainState
        >>> state = TrainState.create(params, optim.sgd(0.1), 0)
        >>> d = tempfile.mkdtemp()
        >>> _ = save(d, state, {"epoch": 0})
        >>> restored = restore(d, like=state)
        >>> restored.params["enc.w"].tolist(), restored.params["enc"]["w"].tolist()
        ([1.0, 1.0], [0.0, 0.0])
    """
    with Checkpointer(path, keep=keep, async_save=False, run_id=run_id) as checkpointer:
        return checkpointer.save(tree, metadata, step=step)

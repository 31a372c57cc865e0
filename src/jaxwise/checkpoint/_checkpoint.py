"""Checkpoints as orbax pytrees: nesting kept, integrity-checked, sharding-aware, locked."""

from __future__ import annotations

import dataclasses
import errno
import functools
import gc
import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise._checks import check_int, check_path, is_key
from jaxwise._lock import describe_holder
from jaxwise._version import __version__
from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint import _safety as safety
from jaxwise.checkpoint._async import SaveQueue, track, untrack
from jaxwise.checkpoint._format import CheckpointError, Damaged
from jaxwise.checkpoint._restore import restore_jaxwise, restore_orbax
from jaxwise.train import TrainState
from jaxwise.tree import path_names

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "Checkpointer",
    "data_fingerprint",
    "latest_step",
    "load_metadata",
    "restore",
    "save",
]


class CheckpointWarning(UserWarning):
    """A step was skipped (damaged, incomplete, another run's), or a dead writer's lock taken."""

    __module__ = "jaxwise.checkpoint"


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


def _static_fields(state: TrainState) -> dict[str, Any]:
    return {
        f.name: getattr(state, f.name)
        for f in dataclasses.fields(state)
        if f.metadata.get("static") and f.metadata.get("saved", True)
    }


def jsonable_static(state: TrainState) -> dict[str, Any]:
    """The static fields of ``state`` as JSON values (``{"repr": ...}`` for non-JSON ones)."""
    out = {}
    for name, value in _static_fields(state).items():
        try:
            out[name] = json.loads(json.dumps(value))
        except (TypeError, ValueError):
            out[name] = {"repr": repr(value)}
    return out


def _describe(
    state: TrainState, metadata: dict[str, Any], run_id: str | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(nested tree to store, sealed metadata document)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    rows, stored = [], []
    for (path, leaf), name in zip(flat, path_names(state)):
        leaf = leaf if isinstance(leaf, jax.Array) else jax.numpy.asarray(leaf)
        impl = str(jax.random.key_impl(leaf)) if is_key(leaf) else None
        value = jax.random.key_data(leaf) if impl else leaf
        stored.append(value)
        rows.append(
            {
                "name": name,
                "path": list(fmt.stored_parts(path)),
                "shape": list(leaf.shape),
                "dtype": str(leaf.dtype),
                "stored_shape": list(value.shape),
                "stored_dtype": str(value.dtype),
                "key_impl": impl,
            }
        )
    for row, checksum in zip(rows, fmt.checksums(stored)):
        row["checksum"] = checksum
    tree = fmt.nest([(tuple(row["path"]), value) for row, value in zip(rows, stored)])
    doc = {
        "format": fmt.FORMAT,
        "jaxwise_version": __version__,
        "step": int(state.step),
        "run_id": run_id,
        "leaves": rows,
        "static": jsonable_static(state),
        "user": metadata,
    }
    return tree, fmt.seal(doc)


def read_meta(step_dir: Path) -> dict[str, Any]:
    """The sealed metadata of a jaxwise step, or `Damaged`."""
    try:
        doc = json.loads((step_dir / fmt.META / "metadata").read_text())
    except (OSError, ValueError) as err:
        raise Damaged(f"its metadata is unreadable ({type(err).__name__})") from None
    if not fmt.verify_seal(doc) or doc.get("format") != fmt.FORMAT:
        raise Damaged("its metadata fails the integrity check (edited or corrupted)")
    return doc


class Foreign(CheckpointError):
    """An intact step that is not this run's: another run's, or a renamed or copied directory."""


def check_identity(doc: dict[str, Any], number: int | None, run_id: str | None) -> None:
    """`Foreign` when the step in directory ``number`` is not the step of ``run_id``."""
    if number is not None and doc.get("step") != number:
        raise Foreign(
            f"its metadata says step {doc.get('step')}: a renamed or copied step directory"
        )
    if run_id is not None and doc.get("run_id") != run_id:
        raise Foreign("written by another run")


def _step_problem(step_dir: Path, number: int, run_id: str | None) -> CheckpointError | None:
    """Why the step in ``step_dir`` may not be taken (``Damaged``/``Foreign``), or None."""
    found = fmt.layout(step_dir)
    if found is None:
        return Damaged("it is incomplete (an interrupted write or a stray directory)")
    if found[0] == "orbax":
        return None if run_id is None else Foreign("written by plain orbax, not by this run")
    try:
        check_identity(read_meta(step_dir), number, run_id)
    except CheckpointError as err:
        return err
    return None


def _check_run_id(run_id: Any) -> str | None:
    if run_id is not None and (not isinstance(run_id, str) or not run_id.strip()):
        raise TypeError(f"`run_id` must be a non-empty str or None, got {run_id!r}")
    return run_id


def _snapshot(state: TrainState) -> TrainState:
    """A copy of ``state``'s arrays on their own devices (dispatched asynchronously).

    The copy outlives the donation of ``state`` to the next training step, so a background
    save can read it while training goes on.
    """
    leaves, treedef = jax.tree.flatten(state)
    arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]
    copies = jax.device_put(
        [leaves[i] for i in arrays], [leaves[i].sharding for i in arrays], may_alias=False
    )
    for i, copy in zip(arrays, copies):
        leaves[i] = copy
    return jax.tree.unflatten(treedef, leaves)


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
        self.run_id = _check_run_id(run_id)
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
        handler = ocp.CompositeCheckpointHandler()
        several = jax.process_count() > 1
        self._writer = (
            ocp.AsyncCheckpointer(handler) if async_save and several else ocp.Checkpointer(handler)
        )
        self._queue = SaveQueue() if async_save and not several else None
        self._pending: int | None = None
        self._closed = False
        track(self)

    def save(self, state: TrainState, metadata: dict[str, Any] | None = None) -> Path:
        """Save ``state`` (and JSON ``metadata``) as step ``int(state.step)``.

        Args:
            state: the [`TrainState`][jaxwise.train.TrainState] to save.
            metadata: a JSON-serialisable dict stored with it, or ``None``.

        Returns:
            The step's directory (complete once ``wait`` returns, with ``async_save``).

        Raises:
            CheckpointError: the previous asynchronous save failed, the step exists already
                (this run's), or the checkpointer is closed.
            OSError: the disk is full (``errno.ENOSPC``, naming the step); nothing is left
                of the step and the earlier ones are untouched.
            TypeError: ``state`` is not a ``TrainState`` or ``metadata`` not a JSON dict.
        """
        if self._closed:
            raise CheckpointError(f"this Checkpointer of {self.path} is closed")
        if not isinstance(state, TrainState):
            raise TypeError(f"`state` must be a TrainState, got {type(state).__name__}")
        if metadata is not None and not isinstance(metadata, dict):
            raise TypeError(f"`metadata` must be a dict or None, got {type(metadata).__name__}")
        metadata = dict(metadata or {})
        try:
            json.dumps(metadata)
        except (TypeError, ValueError) as err:
            raise TypeError(f"`metadata` must be JSON-serialisable: {err}") from None
        self.wait()
        step = int(state.step)
        target = self.path / str(step)
        self._clear_slot(step, target)
        if self._queue is not None:
            write = functools.partial(self._write, _snapshot(state), metadata, step, target)
            self._queue.submit(step, write)
            return target
        self._write(state, metadata, step, target)
        return target

    def _write(self, state: TrainState, metadata: dict[str, Any], step: int, target: Path) -> None:
        """Checksum and write ``state``; then delete steps beyond ``keep``.

        With orbax's ``AsyncCheckpointer`` (several processes) the files are finished, and
        the retention applied, by ``wait``.
        """
        ocp = fmt.orbax()
        tree, doc = _describe(state, metadata, self.run_id)
        safety.check_space(target, safety.needed_bytes(tree, len(json.dumps(doc))))
        self._clear_slot(step, target)
        args = ocp.args.Composite(
            **{fmt.STATE: ocp.args.StandardSave(tree), fmt.META: ocp.args.JsonSave(doc)}
        )
        with safety.signals_held():
            self._pending = step
            try:
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
                if s < step and _step_problem(d, s, self.run_id) is None
            )
            for old in older[: max(0, len(older) - (self.keep - 1))]:
                shutil.rmtree(self.path / str(old), ignore_errors=True)
        _sync(f"jaxwise-checkpoint-done-{step}")

    def _failed(self, step: int, target: Path, err: Exception) -> None:
        """Clean up after a failed write of ``step`` and raise the error (a full disk named)."""
        self._pending = None
        if jax.process_index() == 0:
            safety.remove_leftovers(self.path, step)
        if not safety.is_disk_full(err):
            raise err
        err.__traceback__ = None  # free orbax's abandoned coroutines now, not at exit
        del err
        gc.collect()
        raise OSError(errno.ENOSPC, "No space left on device", str(target)) from None

    def _clear_slot(self, step: int, target: Path) -> None:
        if target.exists():
            problem = _step_problem(target, step, self.run_id)
            if problem is None:
                raise CheckpointError(f"a checkpoint for step {step} already exists in {self.path}")
            if jax.process_index() == 0:  # another run's, stray or damaged: kept, out of the way
                kind = "stray" if isinstance(problem, Foreign) else "damaged"
                n = 0
                while target.with_name(f"{step}.{kind}-{n}").exists():
                    n += 1
                target.rename(target.with_name(f"{step}.{kind}-{n}"))
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
                with safety.signals_held():
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
    state: TrainState,
    metadata: dict[str, Any] | None = None,
    *,
    keep: int = 3,
    run_id: str | None = None,
) -> Path:
    """Save ``state`` (and JSON ``metadata``) as step ``int(state.step)`` under ``path``.

    The state is stored as an orbax pytree that keeps its nesting (``path/<step>/state``,
    readable with plain orbax), typed keys as raw key data; ``path/<step>/meta`` holds the
    leaf table, a checksum per leaf, static fields and ``metadata``, sealed by a digest.
    Each step is written to a temporary directory and renamed when complete, so an
    interrupted write never harms earlier steps. One-shot form of
    [`Checkpointer`][jaxwise.checkpoint.Checkpointer] (takes the directory's writer lock for
    the duration).

    Args:
        path: the checkpoint directory (created if missing).
        state: a [`TrainState`][jaxwise.train.TrainState] (arrays may be sharded, also
            across processes).
        metadata: a JSON-serialisable dict (e.g. epoch,
            [`data_fingerprint`][jaxwise.checkpoint.data_fingerprint]).
        keep: how many steps to keep (older ones of the same run are deleted after this one
            is written).
        run_id: the run this step belongs to (recorded in the step; see
            [`Checkpointer`][jaxwise.checkpoint.Checkpointer]).

    Returns:
        The directory of this step's checkpoint.

    Raises:
        CheckpointError: another writer holds the directory, or the step exists already.
        OSError: the disk is full (``errno.ENOSPC``, naming the step; nothing is left of it).
        TypeError: ``state`` is not a ``TrainState`` or ``metadata`` not a JSON dict.

    Examples:
        >>> import tempfile, jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> params = {"enc.w": jnp.ones(2), "enc": {"w": jnp.zeros(2)}}
        >>> state = TrainState.create(params, optim.sgd(0.1), 0)
        >>> d = tempfile.mkdtemp()
        >>> _ = save(d, state, {"epoch": 0})
        >>> restored = restore(d, like=state)
        >>> restored.params["enc.w"].tolist(), restored.params["enc"]["w"].tolist()
        ([1.0, 1.0], [0.0, 0.0])
    """
    with Checkpointer(path, keep=keep, async_save=False, run_id=run_id) as checkpointer:
        return checkpointer.save(state, metadata)


def latest_step(path: str | Path, *, run_id: str | None = None) -> int | None:
    """The newest step under ``path`` that is complete with intact metadata, or ``None``.

    A cheap check (the arrays are verified by [`restore`][jaxwise.checkpoint.restore]);
    steps written by plain orbax count too (unless ``run_id`` is given). A step directory
    whose metadata names another step (renamed or copied) never counts; with ``run_id``,
    only that run's steps count.

    Args:
        path: the checkpoint directory.
        run_id: count only the steps this run wrote.

    Returns:
        The step number, or ``None`` when there is no complete step.
    """
    check_path(path, "path")
    run_id = _check_run_id(run_id)
    for step, step_dir in sorted(fmt.step_dirs(Path(path).absolute()).items(), reverse=True):
        if _step_problem(step_dir, step, run_id) is None:
            return step
    return None


def load_metadata(
    path: str | Path, step: int | None = None, *, run_id: str | None = None
) -> dict[str, Any]:
    """The user metadata saved with a step (by default the newest step `latest_step` finds).

    Args:
        path: the checkpoint directory.
        step: the step (default: the newest one whose metadata is intact).
        run_id: take only the steps this run wrote.

    Returns:
        The ``metadata`` dict given to ``save``.

    Raises:
        CheckpointError: no such step, or the step is damaged or not ``run_id``'s (named).
    """
    check_path(path, "path")
    run_id = _check_run_id(run_id)
    root = Path(path).absolute()
    steps = fmt.step_dirs(root)
    if step is not None:
        if step not in steps:
            raise CheckpointError(
                f"no checkpoint for step {step} in {root}; available: {sorted(steps)}"
            )
        try:
            doc = read_meta(steps[step])
            check_identity(doc, step, run_id)
        except Foreign as err:
            raise CheckpointError(f"checkpoint step {step} in {root}: {err}") from None
        except Damaged as err:
            raise CheckpointError(f"checkpoint step {step} in {root} is damaged: {err}") from None
        return dict(doc["user"])
    problems = []
    for number, step_dir in sorted(steps.items(), reverse=True):
        problem = _step_problem(step_dir, number, run_id)
        if problem is None and fmt.layout(step_dir) == ("jaxwise", step_dir):
            return dict(read_meta(step_dir)["user"])
        problems.append(f"step {number} ({problem or 'written by plain orbax: no metadata'})")
    detail = f": {'; '.join(problems)}" if problems else ""
    raise CheckpointError(f"no intact checkpoint in {root}{detail}")


def _candidates(root: Path, step: int | None) -> list[tuple[int | None, Path]]:
    if not root.exists():
        raise CheckpointError(f"no checkpoint directory at {root}")
    if fmt.is_pytree_dir(root):
        return [(None, root)]  # ``path`` is itself a plain orbax pytree checkpoint
    steps = fmt.step_dirs(root)
    if step is not None:
        if step not in steps:
            raise CheckpointError(
                f"no checkpoint for step {step} in {root}; available: {sorted(steps)}"
            )
        return [(step, steps[step])]
    if not steps:
        raise CheckpointError(
            f"no complete checkpoint in {root} (an interrupted write leaves none)"
        )
    return [(number, steps[number]) for number in sorted(steps, reverse=True)]


def _restore_one(
    step_dir: Path, number: int | None, like: TrainState, run_id: str | None
) -> tuple[TrainState, dict[str, Any]]:
    found = fmt.layout(step_dir)
    if found is None:
        raise Damaged("it is incomplete (an interrupted write or a stray directory)")
    kind, item_dir = found
    if kind == "orbax":
        if run_id is not None:
            raise Foreign("written by plain orbax, not by this run")
        return restore_orbax(item_dir, like), {}
    doc = read_meta(step_dir)
    check_identity(doc, number, run_id)
    _check_static(doc, like)
    return restore_jaxwise(item_dir / fmt.STATE, doc, like), dict(doc["user"])


def _check_static(doc: dict[str, Any], like: TrainState) -> None:
    saved, current = doc.get("static", {}), jsonable_static(like)
    for name in sorted(set(saved) | set(current)):
        if saved.get(name) != current.get(name):
            raise CheckpointError(
                f"the checkpoint was saved with static `{name}` = {saved.get(name)!r}, but `like` "
                f"has "
                f"{current.get(name)!r}; restore into a state created with the same configuration"
            )


def restore(
    path: str | Path,
    like: TrainState,
    step: int | None = None,
    *,
    with_metadata: bool = False,
    run_id: str | None = None,
) -> Any:
    """Restore a checkpoint into ``like``'s structure, placing every array on ``like``'s sharding.

    By default the newest step is restored; a step that is incomplete (a stray or
    half-written directory), damaged (unreadable files, a leaf failing its checksum,
    metadata failing its digest) or not the run's (a renamed or copied step directory;
    with ``run_id``, another run's step) is skipped with one `CheckpointWarning`
    naming it and the reason, and the newest intact step is restored. With an explicit
    ``step`` such a step is an error. The checkpoint must have ``like``'s paths, shapes,
    dtypes and static fields (else `CheckpointError` naming the first difference).
    Works in every process of a ``jax.distributed`` job (``like`` sharded over a global
    mesh), and reads plain orbax/Flax checkpoints with the same tree (``path`` a pytree
    directory or a directory of steps; a missing ``key`` is taken from ``like``).

    Resuming is bit-identical: training N epochs straight equals k epochs, save, restore
    (in a fresh process) and N − k more.

    Args:
        path: the checkpoint directory.
        like: a [`TrainState`][jaxwise.train.TrainState] (arrays or
            ``jax.ShapeDtypeStruct`` leaves) giving the structure, dtypes and target
            shardings.
        step: the step to restore (default: the newest intact one).
        with_metadata: also return the user metadata of the restored step.
        run_id: take only the steps this run wrote (see
            [`Checkpointer`][jaxwise.checkpoint.Checkpointer]).

    Returns:
        The restored state, or ``(state, metadata)`` with ``with_metadata=True``.

    Raises:
        CheckpointError: no checkpoint, no usable step (each one named with its reason), a
            damaged explicit ``step``, or a checkpoint that does not fit ``like``.
        TypeError: ``like`` is not a ``TrainState`` or ``step`` not an int.
    """
    check_path(path, "path")
    if not isinstance(like, TrainState):
        raise TypeError(f"`like` must be a TrainState, got {type(like).__name__}")
    if step is not None:
        step = check_int(step, "step", min_value=0)
    run_id = _check_run_id(run_id)
    fmt.orbax()
    fmt.quiet_orbax()
    root = Path(path).absolute()
    problems: list[str] = []
    damaged_only = True
    for number, step_dir in _candidates(root, step):
        label = "the checkpoint" if number is None else f"checkpoint step {number}"
        try:
            with safety.signals_held():
                state, meta = _restore_one(step_dir, number, like, run_id)
        except (Damaged, Foreign) as err:
            if step is not None or number is None:
                what = "is damaged" if isinstance(err, Damaged) else "is not this run's"
                raise CheckpointError(f"{label} in {root} {what}: {err}") from None
            damaged_only = damaged_only and isinstance(err, Damaged)
            problems.append(f"step {number} ({err})")
            continue
        except CheckpointError as err:
            raise CheckpointError(f"{label} in {root} does not fit `like`: {err}") from None
        if problems:
            warnings.warn(
                f"skipped {'damaged ' if damaged_only else ''}checkpoint {'; '.join(problems)} "
                f"in {root}; restored step {number}",
                CheckpointWarning,
                stacklevel=2,
            )
        return (state, meta) if with_metadata else state
    raise CheckpointError(f"no intact checkpoint in {root}: {'; '.join(problems)}")


def data_fingerprint(data: Any) -> dict[str, Any]:
    """Shapes, dtypes and a SHA-256 of host data: store it to refuse resuming on other data.

    Args:
        data: a pytree of NumPy (or fully addressable JAX) arrays, e.g.
            ``(x_train, y_train)``.

    Returns:
        A JSON-serialisable dict ``{"shapes", "dtypes", "sha256"}``; equal dicts mean equal
        data.

    Examples:
        >>> import numpy as np
        >>> fp = data_fingerprint((np.zeros((3, 2), np.float32), np.arange(3)))
        >>> fp["shapes"], fp["dtypes"], len(fp["sha256"])
        ([[3, 2], [3]], ['float32', 'int64'], 64)
    """
    digest = hashlib.sha256()
    shapes, dtypes = [], []
    for name, leaf in zip(path_names(data), jax.tree.leaves(data)):
        arr = np.ascontiguousarray(np.asarray(leaf))
        shapes.append(list(arr.shape))
        dtypes.append(str(arr.dtype))
        digest.update(json.dumps([name, arr.shape, str(arr.dtype)]).encode())
        digest.update(arr.tobytes())
    return {"shapes": shapes, "dtypes": dtypes, "sha256": digest.hexdigest()}

"""Checkpoints as orbax pytrees: nesting kept, integrity-checked, sharding-aware, locked."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise._checks import check_int, check_path, is_key
from jaxwise._version import __version__
from jaxwise.checkpoint import _format as fmt
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
    """A damaged or incomplete checkpoint step was skipped in favour of an older intact one."""

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
        if f.metadata.get("static")
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


def _describe(state: TrainState, metadata: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
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


def _intact_meta(step_dir: Path) -> dict[str, Any] | None:
    found = fmt.layout(step_dir)
    if found is None or found[0] != "jaxwise":
        return None
    try:
        return read_meta(step_dir)
    except Damaged:
        return None


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
    [`CheckpointError`][jaxwise.checkpoint.CheckpointError] at once. A step that already
    exists is never overwritten; only steps older than the one just written are deleted
    (beyond ``keep``), and only after it is complete. Every process of a multi-process job
    must call ``save`` with the same state.

    Saves are asynchronous by default (``async_save=True``): ``save`` copies the state's
    arrays on their devices (an asynchronous copy, so the state can be donated to the next
    step at once) and a background thread checksums and writes them. At most one save is in
    flight: the next ``save`` first waits for it. A failed background save is raised, as a
    [`CheckpointError`][jaxwise.checkpoint.CheckpointError] naming its step, by the next
    ``save``, ``wait`` or ``close``; a save still in flight when the program ends (or is
    interrupted) is completed before the interpreter shuts down. In a multi-process job the
    writes go through orbax's ``AsyncCheckpointer``. ``async_save=False`` writes before
    ``save`` returns.

    Args:
        path: the checkpoint directory (created if missing).
        keep: how many steps to keep, >= 1.
        async_save: write the files in the background.

    Raises:
        ImportError: orbax is not installed (``pip install 'jaxwise[checkpoint]'``).
        CheckpointError: another writer holds the directory.
        TypeError: ``path`` is not a path or ``keep`` not an int.
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

    def __init__(self, path: str | Path, *, keep: int = 3, async_save: bool = True) -> None:
        ocp = fmt.orbax()
        fmt.quiet_orbax()
        check_path(path, "path")
        self.path = Path(path).absolute()
        self.keep = check_int(keep, "keep", min_value=1)
        self.async_save = bool(async_save)
        self._lock = _lock_everywhere(self.path)
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
            CheckpointError: the previous asynchronous save failed, the step exists already,
                or the checkpointer is closed.
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
        self._write(state, metadata, step, target, retain=not self.async_save)
        return target

    def _write(
        self,
        state: TrainState,
        metadata: dict[str, Any],
        step: int,
        target: Path,
        *,
        retain: bool = True,
    ) -> None:
        """Checksum and write ``state``; then (``retain``) delete steps beyond ``keep``."""
        ocp = fmt.orbax()
        tree, doc = _describe(state, metadata)
        args = ocp.args.Composite(
            **{fmt.STATE: ocp.args.StandardSave(tree), fmt.META: ocp.args.JsonSave(doc)}
        )
        self._writer.save(target, args=args)
        if retain:
            self._retain(step)
        else:  # orbax's AsyncCheckpointer finishes it; wait() then applies the retention
            self._pending = step

    def _retain(self, step: int) -> None:
        """Delete the intact steps older than ``step`` beyond ``keep`` (process 0)."""
        if jax.process_index() == 0:
            older = sorted(
                s
                for s, d in fmt.step_dirs(self.path).items()
                if s < step and _intact_meta(d) is not None
            )
            for old in older[: max(0, len(older) - (self.keep - 1))]:
                shutil.rmtree(self.path / str(old), ignore_errors=True)
        _sync(f"jaxwise-checkpoint-done-{step}")

    def _clear_slot(self, step: int, target: Path) -> None:
        if target.exists():
            if _intact_meta(target) is not None:
                raise CheckpointError(f"a checkpoint for step {step} already exists in {self.path}")
            if jax.process_index() == 0:  # a stray or damaged directory: keep it, out of the way
                n = 0
                while target.with_name(f"{step}.damaged-{n}").exists():
                    n += 1
                target.rename(target.with_name(f"{step}.damaged-{n}"))
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
            finish()
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
            self._writer.close()
        finally:
            untrack(self)
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def save(
    path: str | Path, state: TrainState, metadata: dict[str, Any] | None = None, *, keep: int = 3
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
        keep: how many steps to keep (older ones are deleted after this one is written).

    Returns:
        The directory of this step's checkpoint.

    Raises:
        CheckpointError: another writer holds the directory, or the step exists already.
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
    with Checkpointer(path, keep=keep, async_save=False) as checkpointer:
        return checkpointer.save(state, metadata)


def latest_step(path: str | Path) -> int | None:
    """The newest step under ``path`` that is complete with intact metadata, or ``None``.

    A cheap check (the arrays are verified by [`restore`][jaxwise.checkpoint.restore]);
    steps written by plain orbax count too.

    Args:
        path: the checkpoint directory.

    Returns:
        The step number, or ``None`` when there is no complete step.
    """
    check_path(path, "path")
    for step, step_dir in sorted(fmt.step_dirs(Path(path).absolute()).items(), reverse=True):
        found = fmt.layout(step_dir)
        if found is not None and (found[0] == "orbax" or _intact_meta(step_dir) is not None):
            return step
    return None


def load_metadata(path: str | Path, step: int | None = None) -> dict[str, Any]:
    """The user metadata saved with a step (by default the newest step with intact metadata).

    Args:
        path: the checkpoint directory.
        step: the step (default: the newest one whose metadata is intact).

    Returns:
        The ``metadata`` dict given to ``save``.

    Raises:
        CheckpointError: no such step, its metadata is damaged, or no step is intact.
    """
    check_path(path, "path")
    root = Path(path).absolute()
    steps = fmt.step_dirs(root)
    if step is not None:
        if step not in steps:
            raise CheckpointError(
                f"no checkpoint for step {step} in {root}; available: {sorted(steps)}"
            )
        try:
            return dict(read_meta(steps[step])["user"])
        except Damaged as err:
            raise CheckpointError(f"checkpoint step {step} in {root} is damaged: {err}") from None
    for _, step_dir in sorted(steps.items(), reverse=True):
        doc = _intact_meta(step_dir)
        if doc is not None:
            return dict(doc["user"])
    raise CheckpointError(f"no intact checkpoint in {root}")


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


def _restore_one(step_dir: Path, like: TrainState) -> tuple[TrainState, dict[str, Any]]:
    found = fmt.layout(step_dir)
    if found is None:
        raise Damaged("it is incomplete (an interrupted write or a stray directory)")
    kind, item_dir = found
    if kind == "orbax":
        return restore_orbax(item_dir, like), {}
    doc = read_meta(step_dir)
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
    path: str | Path, like: TrainState, step: int | None = None, *, with_metadata: bool = False
) -> Any:
    """Restore a checkpoint into ``like``'s structure, placing every array on ``like``'s sharding.

    By default the newest step is restored; a step that is incomplete (a stray or half-written
    directory) or damaged (unreadable files, a leaf failing its checksum, metadata failing its
    digest) is skipped with a [`CheckpointWarning`][jaxwise.checkpoint.CheckpointWarning] naming it
    and the reason, and the newest intact step is restored. With an explicit ``step`` a damaged step
    is an error. The checkpoint must have ``like``'s paths, shapes, dtypes and static fields (else
    [`CheckpointError`][jaxwise.checkpoint.CheckpointError] naming the first difference). Works in
    every process of a ``jax.distributed`` job (``like`` sharded over a global mesh), and reads
    plain orbax/Flax checkpoints with the same tree (``path`` a pytree directory or a directory of
    steps; a missing ``key`` is taken from ``like``).

    Resuming is bit-identical: training N epochs straight equals k epochs, save, restore
    (in a fresh process) and N − k more.

    Args:
        path: the checkpoint directory.
        like: a [`TrainState`][jaxwise.train.TrainState] (arrays or
            ``jax.ShapeDtypeStruct`` leaves) giving the structure, dtypes and target
            shardings.
        step: the step to restore (default: the newest intact one).
        with_metadata: also return the user metadata of the restored step.

    Returns:
        The restored state, or ``(state, metadata)`` with ``with_metadata=True``.

    Raises:
        CheckpointError: no checkpoint, no intact step, a damaged explicit ``step``, or a
            checkpoint that does not fit ``like``.
        TypeError: ``like`` is not a ``TrainState`` or ``step`` not an int.
    """
    check_path(path, "path")
    if not isinstance(like, TrainState):
        raise TypeError(f"`like` must be a TrainState, got {type(like).__name__}")
    if step is not None:
        step = check_int(step, "step", min_value=0)
    fmt.orbax()
    fmt.quiet_orbax()
    root = Path(path).absolute()
    problems = []
    for number, step_dir in _candidates(root, step):
        label = "the checkpoint" if number is None else f"checkpoint step {number}"
        try:
            state, meta = _restore_one(step_dir, like)
        except Damaged as err:
            if step is not None or number is None:
                raise CheckpointError(f"{label} in {root} is damaged: {err}") from None
            problems.append(f"step {number} ({err})")
            continue
        except CheckpointError as err:
            raise CheckpointError(f"{label} in {root} does not fit `like`: {err}") from None
        if problems:
            warnings.warn(
                f"skipped damaged checkpoint {'; '.join(problems)} in {root}; "
                f"restored step {number}",
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

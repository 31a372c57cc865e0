"""Checkpoints with orbax-checkpoint: atomic, verified, bit-identical to resume."""

from __future__ import annotations

import dataclasses
import json
import zlib
from pathlib import Path
from typing import Any

import jax
import numpy as np

from jaxwise._version import __version__
from jaxwise.train._state import TrainState, type_signature
from jaxwise.tree import path_names


class CheckpointError(ValueError):
    """A checkpoint is missing, incomplete, corrupted, or does not match the target state."""


def _is_key(x: Any) -> bool:
    return isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)


def _to_storable(state: TrainState) -> tuple[dict[str, Any], dict[str, str]]:
    """Leaves by dotted path as NumPy arrays; typed keys as raw key data (+ their impl)."""
    leaves, impls = {}, {}
    for name, leaf in zip(path_names(state), jax.tree.leaves(state)):
        if _is_key(leaf):
            impls[name] = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        leaves[name] = np.array(leaf, copy=True)
    return leaves, impls


def _crc(arr: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(arr).tobytes()) & 0xFFFFFFFF


def _static_fields(state: TrainState) -> dict[str, Any]:
    return {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.metadata.get("static")}


def _manager(path: Path, read_only: bool, keep: int | None = None) -> Any:
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(
        max_to_keep=keep, enable_async_checkpointing=False, read_only=read_only, create=not read_only
    )
    return ocp.CheckpointManager(path, options=options)


def save(path: str | Path, state: TrainState, metadata: dict[str, Any] | None = None, *, keep: int = 3) -> Path:
    """Save ``state`` (and JSON ``metadata``) as step ``int(state.step)`` under ``path``.

    Uses orbax-checkpoint's ``CheckpointManager``: each step is written to a
    temporary directory and committed atomically, so an interrupted write
    never destroys the previous good checkpoint (it is ignored on restore).
    Typed PRNG keys are stored as raw key data with their implementation;
    static fields, the tree's paths, shapes, dtypes and a CRC32 per leaf go
    into the metadata and are checked by :func:`restore`. Only the newest
    ``keep`` checkpoints are kept.

    Returns:
      The directory of this step's checkpoint.

    Example:
        >>> import tempfile, jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> state = TrainState.create({"w": jnp.ones(2)}, optim.sgd(0.1), 0)
        >>> d = tempfile.mkdtemp()
        >>> _ = save(d, state, {"epoch": 0})
        >>> restore(d, like=state).params["w"].tolist()
        [1.0, 1.0]
    """
    import orbax.checkpoint as ocp

    if not isinstance(state, TrainState):
        raise TypeError(f"`state` must be a TrainState, got {type(state).__name__}")
    metadata = dict(metadata or {})
    try:
        json.dumps(metadata)
    except TypeError as err:
        raise TypeError(f"`metadata` must be JSON-serialisable: {err}") from err
    path = Path(path).absolute()
    step = int(state.step)
    leaves, impls = _to_storable(state)
    static = _static_fields(state)
    info = {
        "format": "jaxwise-trainstate-1",
        "jaxwise_version": __version__,
        "step": step,
        "paths": list(leaves),
        "signature": [[n, list(s), d] for n, s, d, _ in type_signature(state)],
        "stored": [[name, list(arr.shape), str(arr.dtype)] for name, arr in leaves.items()],
        "key_impls": impls,
        "crc32": {name: _crc(arr) for name, arr in leaves.items()},
        "static": _jsonable_static(static),
        "user": metadata,
    }
    manager = _manager(path, read_only=False, keep=keep)
    try:
        if step in manager.all_steps():
            raise CheckpointError(f"a checkpoint for step {step} already exists in {path}")
        manager.save(step, args=ocp.args.Composite(arrays=ocp.args.StandardSave(leaves), info=ocp.args.JsonSave(info)))
        manager.wait_until_finished()
    finally:
        manager.close()
    return path / str(step)


def _jsonable_static(static: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for name, value in static.items():
        try:
            out[name] = json.loads(json.dumps(value))
        except TypeError:
            out[name] = {"repr": repr(value)}
    return out


def latest_step(path: str | Path) -> int | None:
    """The newest complete checkpoint step under ``path``, or ``None``."""
    path = Path(path).absolute()
    if not path.is_dir():
        return None
    manager = _manager(path, read_only=True)
    try:
        return manager.latest_step()
    finally:
        manager.close()


def _read_info(manager: Any, path: Path, step: int) -> dict[str, Any]:
    import orbax.checkpoint as ocp

    try:
        return manager.restore(step, args=ocp.args.Composite(info=ocp.args.JsonRestore()))["info"]
    except Exception as err:  # noqa: BLE001 - any orbax failure means an unreadable checkpoint
        raise CheckpointError(f"checkpoint step {step} in {path} is unreadable (corrupted or partial): {err}") from err


def load_metadata(path: str | Path, step: int | None = None) -> dict[str, Any]:
    """The user metadata saved with a checkpoint (the latest one by default)."""
    path = Path(path).absolute()
    manager, step = _open(path, step)
    try:
        return dict(_read_info(manager, path, step)["user"])
    finally:
        manager.close()


def _open(path: Path, step: int | None) -> tuple[Any, int]:
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory at {path}")
    manager = _manager(path, read_only=True)
    steps = manager.all_steps()
    if not steps:
        manager.close()
        raise CheckpointError(f"no complete checkpoint in {path} (an interrupted write leaves none)")
    if step is None:
        step = max(steps)
    elif step not in steps:
        manager.close()
        raise CheckpointError(f"no checkpoint for step {step} in {path}; available: {sorted(steps)}")
    return manager, step


def restore(path: str | Path, like: TrainState, step: int | None = None) -> TrainState:
    """Restore the checkpoint at ``path`` (latest step by default) into ``like``'s structure.

    The checkpoint must have exactly ``like``'s paths, shapes and dtypes
    (else :class:`CheckpointError` names the first differing path); every
    leaf is verified against its saved CRC32, so a corrupted file is
    detected rather than silently loaded. Typed keys come back typed; static
    fields (configuration) must equal ``like``'s.

    Resuming is bit-identical: training N epochs straight equals k epochs,
    save, restore (in a fresh process) and N − k more.
    """
    import orbax.checkpoint as ocp

    if not isinstance(like, TrainState):
        raise TypeError(f"`like` must be a TrainState, got {type(like).__name__}")
    path = Path(path).absolute()
    manager, step = _open(path, step)
    try:
        info = _read_info(manager, path, step)
        _check_structure(info, like, path, step)
        _check_static(info, like, path, step)
        target = {name: jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype)) for name, shape, dtype in info["stored"]}
        try:
            arrays = manager.restore(step, args=ocp.args.Composite(arrays=ocp.args.StandardRestore(target)))["arrays"]
        except Exception as err:  # noqa: BLE001
            raise CheckpointError(f"checkpoint step {step} in {path} is unreadable (corrupted or partial): {err}") from err
    finally:
        manager.close()
    leaves = []
    for name in info["paths"]:
        host = np.asarray(arrays[name])
        if _crc(host) != info["crc32"][name]:
            raise CheckpointError(f"checkpoint step {step} in {path} is corrupted: `{name}` fails its CRC32 check")
        value = jax.numpy.asarray(host)
        if name in info["key_impls"]:
            value = jax.random.wrap_key_data(value, impl=info["key_impls"][name])
        leaves.append(value)
    return jax.tree.unflatten(jax.tree.structure(like), leaves)


def _check_structure(info: dict[str, Any], like: TrainState, path: Path, step: int) -> None:
    saved = [(n, tuple(s), d) for n, s, d in info["signature"]]
    target = [(n, s, d) for n, s, d, _ in type_signature(like)]
    for (sn, ss, sd), (tn, ts, td) in zip(saved, target):
        if sn != tn:
            raise CheckpointError(f"checkpoint step {step} in {path} does not match `like`: first differing path: "
                                  f"checkpoint has `{sn}`, `like` has `{tn}`")
        if ss != ts or sd != td:
            raise CheckpointError(f"checkpoint step {step} in {path} does not match `like` at `{sn}`: "
                                  f"checkpoint {sd}{list(ss)}, `like` {td}{list(ts)}")
    if len(saved) != len(target):
        longer, which = (saved, "checkpoint") if len(saved) > len(target) else (target, "`like`")
        raise CheckpointError(f"checkpoint step {step} in {path} does not match `like`: {which} has extra path "
                              f"`{longer[min(len(saved), len(target))][0]}`")


def _check_static(info: dict[str, Any], like: TrainState, path: Path, step: int) -> None:
    saved = info.get("static", {})
    current = _jsonable_static(_static_fields(like))
    for name in sorted(set(saved) | set(current)):
        if saved.get(name) != current.get(name):
            raise CheckpointError(
                f"checkpoint step {step} in {path} was saved with static `{name}` = {saved.get(name)!r}, but "
                f"`like` has {current.get(name)!r}; restore into a state created with the same configuration"
            )

"""On-disk format of jaxwise checkpoints: nested orbax trees, checksums, sealed metadata, locks.

A checkpoint directory holds one sub-directory per step (``<root>/<step>/``) with two orbax
items: ``state`` (a ``StandardSave`` pytree of nested dicts that mirrors the state's nesting,
typed keys stored as their raw ``uint32`` key data) and ``meta`` (a ``JsonSave`` document with
the leaf table, a checksum per leaf, the static fields, the user's metadata and a SHA-256
digest over all of it). Dict keys are stored as they are, except that ``%``, ``.`` and ``/``
are percent-escaped: orbax names arrays by joining keys with dots, so ``{"enc.w": ...}`` and
``{"enc": {"w": ...}}`` would otherwise collide.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwise._errors import JaxwiseError
from jaxwise._shared._extras import require
from jaxwise._shared._lock import FileLock, LockHeld, describe_holder
from jaxwise.checkpoint._safety import drop_closed_loop_reports

FORMAT = "jaxwise-checkpoint-2"
STATE, META = "state", "meta"
LOCK_NAME = ".jaxwise-writer.lock"


class CheckpointError(JaxwiseError, ValueError):
    """A checkpoint is missing, incomplete, corrupted, locked, or does not fit the target state."""

    __module__ = "jaxwise.checkpoint"


class CheckpointWarning(UserWarning):
    """A step was skipped (damaged, incomplete, another run's), or a dead writer's lock taken."""

    __module__ = "jaxwise.checkpoint"


class Damaged(CheckpointError):
    """One step of a checkpoint directory is unreadable or fails its integrity check."""


def orbax() -> Any:
    """The ``orbax.checkpoint`` module, or one ``ImportError`` naming the ``checkpoint`` extra."""
    return require("orbax.checkpoint", extra="checkpoint", feature="jaxwise.checkpoint")


# ----------------------------------------------------------------------------- logging


class _OrbaxFilter(logging.Filter):
    """Drop orbax's informational and warning records, and its background threads' reports.

    Other errors still pass. A background thread's exception reaches the caller anyway
    (through the future the caller waits on), where jaxwise turns it into one error.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        noisy = "orbax" in record.pathname or record.name.startswith("orbax")
        if noisy and "raised an exception" in str(record.msg):
            return False
        return record.levelno >= logging.ERROR or not noisy


_FILTER = _OrbaxFilter()


def quiet_orbax() -> None:
    """Silence orbax's ``WARNING:absl`` lines (idempotent; other absl users are unaffected).

    Also drops tensorstore's harmless "Event loop is closed" reports (see ``_safety``).
    """
    drop_closed_loop_reports()
    for name in ("absl", "orbax", "orbax.checkpoint"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)


# ----------------------------------------------------------------------------- tree paths


def escape(name: str) -> str:
    """Percent-escape the characters orbax treats as separators (``%``, ``.``, ``/``)."""
    if name == "":
        return "%"
    return name.replace("%", "%25").replace(".", "%2E").replace("/", "%2F")


def _part(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def raw_parts(path: Sequence[Any]) -> tuple[str, ...]:
    """A key path as plain strings (dict keys, attribute names, sequence indices)."""
    return tuple(_part(k) for k in path)


def stored_parts(path: Sequence[Any]) -> tuple[str, ...]:
    """A key path as the (escaped) nested dict keys under which a jaxwise checkpoint stores it."""
    return tuple(escape(p) for p in raw_parts(path))


def nest(items: Sequence[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    """Nested dicts from ``(parts, value)`` pairs; colliding paths raise ``CheckpointError``."""
    root: dict[str, Any] = {}
    for parts, value in items:
        node = root
        for depth, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise CheckpointError(f"state paths collide at `{'.'.join(parts[: depth + 1])}`")
            node = child
        if parts[-1] in node:
            raise CheckpointError(
                f"state paths collide at `{'.'.join(parts)}` (keys that print alike)"
            )
        node[parts[-1]] = value
    return root


def lookup(tree: Any, parts: Sequence[str]) -> Any:
    """The value at ``parts`` in nested dicts/lists, or ``KeyError``."""
    for part in parts:
        tree = tree[int(part)] if isinstance(tree, (list, tuple)) else tree[part]
    return tree


# ----------------------------------------------------------------------------- checksums


def _words(x: jax.Array) -> jax.Array:
    """The bits of ``x`` as a flat uint32 vector (exact for every dtype)."""
    if jnp.issubdtype(x.dtype, jnp.complexfloating):
        return jnp.concatenate([_words(jnp.real(x)), _words(jnp.imag(x))])
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    bits = np.dtype(x.dtype).itemsize * 8
    unsigned = {8: jnp.uint8, 16: jnp.uint16, 32: jnp.uint32, 64: jnp.uint32}[bits]
    return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32).reshape(-1)


def _leaf_checksum(x: jax.Array) -> jax.Array:
    # sum(v_i * m_i) mod 2^32 with odd multipliers m_i: any change of one word changes the sum,
    # and wrap-around addition is exact whatever the sharding and the reduction order.
    words = _words(x)
    idx = jnp.arange(words.shape[0], dtype=jnp.uint32)
    m1 = (idx * np.uint32(2654435761)) | np.uint32(1)
    m2 = ((idx ^ np.uint32(0x5BD1E995)) * np.uint32(0x85EBCA6B)) | np.uint32(1)
    mixed = words ^ (words >> np.uint32(15))
    return jnp.stack([jnp.sum(words * m1, dtype=jnp.uint32), jnp.sum(mixed * m2, dtype=jnp.uint32)])


def checkpoint_checksums(leaves: Sequence[jax.Array]) -> jax.Array:
    """``uint32[len(leaves), 2]``: the two checksum words of each leaf (see `checksums`)."""
    return jnp.stack([_leaf_checksum(x) for x in leaves])


@functools.lru_cache(maxsize=64)
def checksum_program(out_sharding: jax.sharding.Sharding) -> Any:
    """The jitted `checkpoint_checksums` with its result on ``out_sharding``."""
    return jax.jit(checkpoint_checksums, out_shardings=out_sharding)


def _group_key(leaf: jax.Array) -> tuple[int, ...]:
    return tuple(sorted(d.id for d in leaf.sharding.device_set))


def checksums(leaves: Sequence[jax.Array]) -> list[str]:
    """A 64-bit checksum (hex) of each array's bits, computed on its devices (works multi-process).

    One compiled program per group of leaves living on the same devices.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, leaf in enumerate(leaves):
        groups.setdefault(_group_key(leaf), []).append(i)
    out: list[str] = [""] * len(leaves)
    for members in groups.values():
        sharding = leaves[members[0]].sharding
        if isinstance(sharding, NamedSharding):
            sharding = NamedSharding(sharding.mesh, P())
        group = [leaves[i] for i in members]
        group = jax.device_put(group, [x.sharding for x in group])  # committed: one cache entry
        sums = np.asarray(checksum_program(sharding)(group))
        for i, (a, b) in zip(members, sums.tolist()):
            out[i] = f"{int(a):08x}{int(b):08x}"
    return out


# ----------------------------------------------------------------------------- sealed metadata


def _canonical(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def seal(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` plus a ``digest`` (SHA-256 of its canonical JSON)."""
    return {**doc, "digest": hashlib.sha256(_canonical(doc)).hexdigest()}


def verify_seal(doc: Any) -> bool:
    """True when ``doc`` is a sealed dict whose digest matches its content."""
    if not isinstance(doc, dict) or "digest" not in doc:
        return False
    body = {k: v for k, v in doc.items() if k != "digest"}
    return hashlib.sha256(_canonical(body)).hexdigest() == doc["digest"]


# ----------------------------------------------------------------------------- directory layout


def step_dirs(root: Path) -> dict[int, Path]:
    """Every ``<root>/<integer>/`` directory (complete or not), by step."""
    if not root.is_dir():
        return {}
    return {int(p.name): p for p in root.iterdir() if p.is_dir() and p.name.isdigit()}


def is_pytree_dir(path: Path) -> bool:
    """An orbax pytree item directory (``StandardSave``/``PyTreeSave``)."""
    return (path / "_METADATA").is_file()


def layout(step_dir: Path) -> tuple[str, Path] | None:
    """``("jaxwise", dir)``, ``("orbax", item_dir)`` (plain orbax), or None if incomplete."""
    state = step_dir / STATE
    if (step_dir / META / "metadata").is_file() and (
        (state / "data").is_file() or is_pytree_dir(state)
    ):
        return "jaxwise", step_dir
    if (step_dir / META).exists() or (step_dir / STATE).exists():
        return None  # a jaxwise step with an item missing: incomplete
    if is_pytree_dir(step_dir):
        return "orbax", step_dir
    items = (
        [p for p in step_dir.iterdir() if p.is_dir() and is_pytree_dir(p)]
        if step_dir.is_dir()
        else []
    )
    return ("orbax", items[0]) if len(items) == 1 else None


# ----------------------------------------------------------------------------- writer lock


class DirLock:
    """An exclusive, non-blocking ``flock`` on ``<root>/.jaxwise-writer.lock``.

    Held by one writer (one `jaxwise.checkpoint.Checkpointer`) at a time, across processes;
    the operating system releases it when the holder exits, even if it crashes. A refused
    writer is told which process holds it (pid, host, command).
    """

    def __init__(self, root: Path) -> None:
        if root.exists() and not root.is_dir():
            raise CheckpointError(f"checkpoint directory {root}: is a file, expected a directory")
        root.mkdir(parents=True, exist_ok=True)
        self._lock = FileLock(root / LOCK_NAME)
        try:
            self.stale = self._lock.acquire()
        except LockHeld as err:
            raise CheckpointError(
                f"checkpoint directory {root} is in use by another writer "
                f"({describe_holder(err.holder)}); use another directory or wait until that "
                "run ends"
            ) from None

    def release(self) -> None:
        """Release the lock (idempotent)."""
        self._lock.release()

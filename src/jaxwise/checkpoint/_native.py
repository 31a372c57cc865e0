"""The single-process step format: one data file, one sealed metadata file, one rename.

``<step>/state/data`` holds every leaf's bytes back to back (C order, typed keys as their
raw key data), written with one ``writev`` call per 1024 leaves; ``<step>/meta/metadata``
is the sealed JSON document whose leaf table gives each leaf's offset, size and CRC-32,
computed on the very bytes handed to the kernel. Both files are written into
``<step>.jaxwise-tmp``, flushed to disk (``fsync``) and the directory is renamed to
``<step>`` when complete, so a crash leaves either a whole step or a temporary directory
that is never taken for one.

Restoring reads the data file once, checks every leaf's CRC-32 before any byte reaches a
device, and places the arrays on the target's shardings with one ``device_put``.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint._format import Damaged
from jaxwise.checkpoint._safety import TMP_MARKS

__all__ = [
    "FORMAT",
    "TMP_MARK",
    "check_data",
    "check_leaf",
    "host_bytes",
    "read_leaves",
    "sharding_of",
    "write_step",
]

FORMAT = "jaxwise-checkpoint-3"
TMP_MARK = TMP_MARKS[1]
DATA = "data"
_IOV_MAX = 1024


def host_bytes(leaves: Sequence[Any]) -> list[memoryview]:
    """Each array's bytes in C order on the host (one device-to-host copy per leaf)."""
    out = []
    for leaf in leaves:
        arr = np.ascontiguousarray(np.asarray(leaf))
        out.append(memoryview(arr.reshape(-1).view(np.uint8)) if arr.size else memoryview(b""))
    return out


def _write_all(fd: int, buffers: Sequence[memoryview]) -> None:
    """Write every buffer to ``fd`` (``writev``, resumed after a short write)."""
    pending = [b for b in buffers if len(b)]
    while pending:
        batch = pending[:_IOV_MAX]
        done = os.writev(fd, batch)
        rest = pending[len(batch) :]
        for i, buf in enumerate(batch):
            if done < len(buf):
                pending = [buf[done:], *batch[i + 1 :], *rest]
                break
            done -= len(buf)
        else:
            pending = rest


def _write_file(path: Path, buffers: Sequence[memoryview]) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write_all(fd, buffers)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_step(
    target: Path, rows: list[dict[str, Any]], data: Sequence[memoryview], doc: dict[str, Any]
) -> None:
    """Write one step at ``target`` (the rows get their offsets and checksums; ``doc`` sealed).

    On any error the temporary directory is removed and the error raised; ``target`` is
    created only by the final rename.
    """
    tmp = target.with_name(target.name + TMP_MARK)
    if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / fmt.STATE).mkdir(parents=True)
        (tmp / fmt.META).mkdir()
        offset = 0
        for row, buf in zip(rows, data):
            row.update(offset=offset, nbytes=len(buf), crc32=f"{zlib.crc32(buf):08x}")
            offset += len(buf)
        _write_file(tmp / fmt.STATE / DATA, data)
        sealed = fmt.seal({**doc, "format": FORMAT, "leaves": rows})
        text = json.dumps(sealed, allow_nan=False).encode()
        _write_file(tmp / fmt.META / "metadata", [memoryview(text)])
        for sub in (tmp / fmt.STATE, tmp / fmt.META, tmp):
            _fsync_dir(sub)
        tmp.rename(target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_leaf(row: dict[str, Any], blob: memoryview) -> np.ndarray:
    """The leaf of ``row`` in the data file's bytes ``blob``, after its CRC-32 (or `Damaged`)."""
    return _array(row, blob)


def _array(row: dict[str, Any], blob: memoryview) -> np.ndarray:
    start, size = int(row["offset"]), int(row["nbytes"])
    chunk = blob[start : start + size]
    if len(chunk) != size:
        raise Damaged(f"`{row['name']}` is truncated (corrupted data)")
    if f"{zlib.crc32(chunk):08x}" != row["crc32"]:
        raise Damaged(f"`{row['name']}` fails its checksum (corrupted data)")
    dtype = jnp.dtype(row["stored_dtype"])
    shape = tuple(row["stored_shape"])
    if size != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise Damaged(f"`{row['name']}` has the wrong size (corrupted data)")
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def check_data(step_dir: Path, rows: list[dict[str, Any]]) -> None:
    """`Damaged` unless every leaf of the native step in ``step_dir`` passes its CRC-32."""
    try:
        blob = memoryview((step_dir / fmt.STATE / DATA).read_bytes())
    except OSError as err:
        raise Damaged(f"its data file is unreadable ({type(err).__name__})") from None
    for row in rows:
        _array(row, blob)


def sharding_of(leaf: Any) -> jax.sharding.Sharding:
    """``leaf``'s sharding, or the first local device for a leaf without one."""
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding
    return jax.sharding.make_single_device_sharding(jax.local_devices()[0])


def read_leaves(step_dir: Path, rows: list[dict[str, Any]], like_leaves: list[Any]) -> list[Any]:
    """The checked leaves of a native step, on ``like_leaves``' shardings (keys re-wrapped)."""
    try:
        blob = memoryview((step_dir / fmt.STATE / DATA).read_bytes())
    except OSError as err:
        raise Damaged(f"its data file is unreadable ({type(err).__name__})") from None
    arrays = [_array(row, blob) for row in rows]
    placed = jax.device_put(arrays, [sharding_of(leaf) for leaf in like_leaves], may_alias=False)
    return [
        jax.random.wrap_key_data(v, impl=row["key_impl"]) if row["key_impl"] else v
        for row, v in zip(rows, placed)
    ]

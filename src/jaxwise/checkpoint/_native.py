"""The single-process step format: an orbax pytree item that jaxwise writes itself.

``<step>/state/`` is laid out as orbax's own pytree item: ``_METADATA`` (the tree),
``_sharding`` (each leaf's sharding) and an OCDBT key-value store (``manifest.ocdbt`` and one
data file under ``d/``, see ``_ocdbt``) that holds a zarr v2 array per leaf
(``<name>/.zarray``, one uncompressed chunk with the leaf's bytes in C order), so that a
plain ``ocp.StandardCheckpointer().restore(<step>/state)`` reads it, with or without a
target tree. The leaves' bytes go into the data file with one ``writev`` from their host
buffers. ``<step>/meta/metadata`` is the sealed JSON document whose leaf table gives each
leaf's chunk key, size and CRC-32, computed on the very bytes handed to the kernel. Every
file is written into ``<step>.jaxwise-tmp``, flushed (``fsync``) and the directory is
renamed to ``<step>`` when complete, so a crash leaves either a whole step or a temporary
directory that is never taken for one.

Until the sixth round every leaf's bytes lay back to back in one file, ``<step>/state/data``
(format ``jaxwise-checkpoint-3``); such steps are still read.

Restoring reads each leaf's chunk, checks its CRC-32 before any byte reaches a device, and
places the arrays on the target's shardings with one ``device_put``.
"""

from __future__ import annotations

import base64
import functools
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
from jaxwise.checkpoint import _ocdbt
from jaxwise.checkpoint._format import Damaged
from jaxwise.checkpoint._safety import TMP_MARKS

__all__ = [
    "FORMAT",
    "FORMATS",
    "TMP_MARK",
    "check_data",
    "host_arrays",
    "host_bytes",
    "read_leaves",
    "sharding_of",
    "write_step",
]

FORMAT = "jaxwise-checkpoint-4"
SINGLE_FILE = "jaxwise-checkpoint-3"  # every leaf in <step>/state/data: read, no longer written
FORMATS = (FORMAT, SINGLE_FILE)
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


# ----------------------------------------------------------------------------- orbax's layout


def _chunk(row: dict[str, Any]) -> str:
    """The key of a leaf's single zarr chunk in the item's store (``params.w/0.0``)."""
    return ".".join(row["path"]) + "/" + ".".join(["0"] * max(1, len(row["stored_shape"])))


def _zarray_key(row: dict[str, Any]) -> str:
    return ".".join(row["path"]) + "/.zarray"


def _zarray(row: dict[str, Any]) -> bytes:
    """The zarr v2 ``.zarray`` of a leaf: one uncompressed chunk of its whole shape."""
    dtype = np.dtype(row["stored_dtype"])
    shape = list(row["stored_shape"])
    doc = {
        "chunks": [max(1, n) for n in shape],
        "compressor": None,
        "dimension_separator": ".",
        "dtype": dtype.str if dtype.kind in "biufc" else dtype.name,  # bfloat16, float8_*, int4
        "fill_value": None,
        "filters": None,
        "order": "C",
        "shape": shape,
        "zarr_format": 2,
    }
    return json.dumps(doc).encode()


@functools.lru_cache(maxsize=256)
def _sharding_text(sharding: jax.sharding.Sharding) -> str:
    """``sharding`` as orbax records it in ``_sharding`` (a mesh, else the first device)."""
    meta = fmt.orbax().metadata
    if isinstance(sharding, jax.sharding.NamedSharding):
        return meta.NamedShardingMetadata.from_jax_sharding(sharding).to_serialized_string()
    device = min(sharding.device_set, key=lambda d: d.id)
    return meta.SingleDeviceShardingMetadata(device_str=str(device)).to_serialized_string()


def _item_files(
    rows: list[dict[str, Any]], shardings: Sequence[jax.sharding.Sharding]
) -> dict[str, bytes]:
    """orbax's ``_METADATA`` and ``_sharding`` documents for the leaves of ``rows``."""
    tree, placed = {}, {}
    for row, sharding in zip(rows, shardings):
        parts = row["path"]
        tree[str(tuple(parts))] = {
            "key_metadata": [{"key": part, "key_type": 2} for part in parts],
            "value_metadata": {
                "value_type": "jax.Array",
                "skip_deserialize": False,
                "write_shape": list(row["stored_shape"]),
            },
        }
        name = base64.urlsafe_b64encode(".".join(parts).encode()).decode()
        placed[name] = _sharding_text(sharding)
    metadata = {
        "tree_metadata": tree,
        "use_ocdbt": True,
        "use_zarr3": False,
        "store_array_data_equal_to_fill_value": True,
        "custom_metadata": None,
    }
    return {"_METADATA": json.dumps(metadata).encode(), "_sharding": json.dumps(placed).encode()}


# ----------------------------------------------------------------------------- writing


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


def _store(state: Path) -> Any:
    """The OCDBT key-value store of the item ``state``, opened by TensorStore to read.

    A fresh context each time: a shared one would cache a store's manifest by its path,
    which a later step of the same number replaces.
    """
    import tensorstore as ts

    spec = {"driver": "ocdbt", "base": {"driver": "file", "path": f"{state}/"}}
    return ts.KvStore.open(spec, context=ts.Context()).result()


def _write_store(state: Path, rows: list[dict[str, Any]], data: Sequence[memoryview]) -> None:
    """Every leaf's ``.zarray`` and chunk into the item's OCDBT store (files flushed)."""
    entries = []
    for row, buf in zip(rows, data):
        chunk = _chunk(row)
        row.update(chunk=chunk, nbytes=len(buf), crc32=f"{zlib.crc32(buf):08x}")
        entries.append((_zarray_key(row), memoryview(_zarray(row))))
        if len(buf):  # an empty array has no chunk (orbax's layout neither)
            entries.append((chunk, buf))
    _ocdbt.write_store(state, entries, _write_file)


def _write_state(
    state: Path,
    rows: list[dict[str, Any]],
    data: Sequence[memoryview],
    shardings: Sequence[jax.sharding.Sharding],
) -> dict[str, str]:
    """Write the orbax item into the new directory ``state`` (every file flushed).

    Returns the CRC-32 of orbax's ``_METADATA`` and ``_sharding`` (recorded in the sealed
    metadata: a restore checks every file plain orbax reads).
    """
    _write_store(state, rows, data)  # first: it gives the rows their chunk keys
    crcs = {}
    for name, text in _item_files(rows, shardings).items():
        _write_file(state / name, [memoryview(text)])
        crcs[name] = f"{zlib.crc32(text):08x}"
    for sub in (state / "d", state):
        _fsync_dir(sub)
    return crcs


def write_step(
    target: Path,
    rows: list[dict[str, Any]],
    data: Sequence[memoryview],
    doc: dict[str, Any],
    shardings: Sequence[jax.sharding.Sharding],
) -> None:
    """Write one step at ``target`` (the rows get their chunk keys and checksums; ``doc`` sealed).

    On any error the temporary directory is removed and the error raised; ``target`` is
    created only by the final rename.
    """
    tmp = target.with_name(target.name + TMP_MARK)
    if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    try:
        (tmp / fmt.STATE).mkdir(parents=True)
        (tmp / fmt.META).mkdir()
        item = _write_state(tmp / fmt.STATE, rows, data, shardings)
        sealed = fmt.seal({**doc, "format": FORMAT, "leaves": rows, "item": item})
        text = json.dumps(sealed, allow_nan=False).encode()
        _write_file(tmp / fmt.META / "metadata", [memoryview(text)])
        for sub in (tmp / fmt.META, tmp):
            _fsync_dir(sub)
        tmp.rename(target)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


# ----------------------------------------------------------------------------- reading


def _array(row: dict[str, Any], chunk: memoryview) -> np.ndarray:
    """The leaf of ``row`` from its bytes ``chunk``, after its size and CRC-32 (or `Damaged`)."""
    size = int(row["nbytes"])
    if len(chunk) != size:
        raise Damaged(f"`{row['name']}` is truncated (corrupted data)")
    if f"{zlib.crc32(chunk):08x}" != row["crc32"]:
        raise Damaged(f"`{row['name']}` fails its checksum (corrupted data)")
    dtype = jnp.dtype(row["stored_dtype"])
    shape = tuple(row["stored_shape"])
    if size != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise Damaged(f"`{row['name']}` has the wrong size (corrupted data)")
    return np.frombuffer(chunk, dtype=dtype).reshape(shape)


def _check_item(state: Path, doc: dict[str, Any]) -> None:
    """`Damaged` unless orbax's ``_METADATA`` and ``_sharding`` have their recorded CRC-32."""
    for name, crc in doc["item"].items():
        try:
            text = (state / name).read_bytes()
        except OSError as err:
            raise Damaged(f"its orbax `{name}` is unreadable ({type(err).__name__})") from None
        if f"{zlib.crc32(text):08x}" != crc:
            raise Damaged(f"its orbax `{name}` fails its checksum (corrupted data)")


def _unreadable(err: Exception) -> Damaged:
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    return Damaged(f"its data is unreadable ({type(err).__name__}: {first})")


def _chunks(state: Path, rows: list[dict[str, Any]]) -> list[memoryview]:
    """Every leaf's chunk from the item's store, each ``.zarray`` checked (read concurrently).

    An empty array has no chunk (orbax's layout neither).
    """
    try:
        store = _store(state)
        headers = [store.read(_zarray_key(row)) for row in rows]
        pending = [store.read(row["chunk"]) if int(row["nbytes"]) else None for row in rows]
        found = [h.result().value for h in headers]
        chunks = [memoryview(p.result().value if p is not None else b"") for p in pending]
    except (OSError, ValueError) as err:  # TensorStore's errors are ValueErrors
        raise _unreadable(err) from None
    for row, header in zip(rows, found):
        if header != _zarray(row):
            raise Damaged(f"the zarr metadata of `{row['name']}` differs (corrupted data)")
    return chunks


def host_arrays(step_dir: Path, doc: dict[str, Any]) -> list[np.ndarray]:
    """The checked leaves of the native step in ``step_dir`` (`Damaged` on a bad CRC-32)."""
    rows, state = doc["leaves"], step_dir / fmt.STATE
    if doc["format"] == SINGLE_FILE:
        try:
            blob = memoryview((state / DATA).read_bytes())
        except OSError as err:
            raise _unreadable(err) from None
        offsets = [int(row["offset"]) for row in rows]
        chunks = [blob[o : o + int(row["nbytes"])] for o, row in zip(offsets, rows)]
    else:
        _check_item(state, doc)
        chunks = _chunks(state, rows)
    return [_array(row, chunk) for row, chunk in zip(rows, chunks)]


def check_data(step_dir: Path, doc: dict[str, Any]) -> None:
    """`Damaged` unless every leaf of the native step in ``step_dir`` passes its CRC-32."""
    host_arrays(step_dir, doc)


def sharding_of(leaf: Any) -> jax.sharding.Sharding:
    """``leaf``'s sharding, or the first local device for a leaf without one."""
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding
    return jax.sharding.make_single_device_sharding(jax.local_devices()[0])


def read_leaves(step_dir: Path, doc: dict[str, Any], like_leaves: list[Any]) -> list[Any]:
    """The checked leaves of a native step, on ``like_leaves``' shardings (keys re-wrapped)."""
    rows = doc["leaves"]
    arrays = host_arrays(step_dir, doc)
    placed = jax.device_put(arrays, [sharding_of(leaf) for leaf in like_leaves], may_alias=False)
    return [
        jax.random.wrap_key_data(v, impl=row["key_impl"]) if row["key_impl"] else v
        for row, v in zip(rows, placed)
    ]

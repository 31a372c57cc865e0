"""An OCDBT key-value store written in one pass: what TensorStore (and so orbax) reads.

OCDBT is TensorStore's B+tree format (``manifest.ocdbt`` and data files under ``d/``), the
layout orbax gives a pytree item. A store of one version with one leaf B+tree node is all a
checkpoint step needs, so jaxwise writes it itself: every value out of line in one data
file, written with one ``writev`` straight from the arrays' host buffers (TensorStore's
Python API would copy each value twice on its way in), the node after the values, and the
manifest that points at the node. Both files carry the format's CRC-32C checksums.
TensorStore reads the result as any store it wrote (``tests/test_checkpoint_orbax_read.py``).
"""

from __future__ import annotations

import struct
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

__all__ = ["crc32c", "write_store"]

_MANIFEST_MAGIC = 0x0CDB3A2A
_BTREE_MAGIC = 0x0CDB20DE
_MAX_NODE = 8 * 2**20  # TensorStore's default ``max_decoded_node_bytes``
_ARITY_LOG2 = 4  # TensorStore's default ``version_tree_arity_log2``


def _crc_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_CRC_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``: OCDBT's checksum of its manifest and nodes.

    Examples:
        >>> hex(crc32c(b"123456789"))
        '0xe3069283'
    """
    c = 0xFFFFFFFF
    table = _CRC_TABLE
    for byte in data:
        c = table[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _varints(values: Sequence[int]) -> bytes:
    """``values`` as LEB128 varints, back to back."""
    out = bytearray()
    for n in values:
        while n >= 0x80:
            out.append((n & 0x7F) | 0x80)
            n >>= 7
        out.append(n)
    return bytes(out)


def _varint(n: int) -> bytes:
    return _varints((n,))


def _framed(magic: int, body: bytes) -> bytes:
    """``body`` with OCDBT's header (magic, total length, version 0, uncompressed) and CRC."""
    length = 4 + 8 + 1 + 1 + len(body) + 4
    blob = struct.pack(">I", magic) + struct.pack("<Q", length) + b"\x00\x00" + body
    return blob + struct.pack("<I", crc32c(blob))


def _file_table(path: bytes) -> bytes:
    """A data file table of the one file ``path`` (no base path)."""
    return b"\x01" + _varint(len(path)) + b"\x00" + path


def _common(a: bytes, b: bytes) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _leaf_node(path: bytes, keys: list[bytes], offsets: list[int], lengths: list[int]) -> bytes:
    """A leaf B+tree node of sorted ``keys``, every value out of line in data file 0."""
    prefixes = [_common(a, b) for a, b in zip(keys, keys[1:])]
    suffixes = [len(k) - p for k, p in zip(keys, [0, *prefixes])]
    body = b"".join(
        [
            b"\x00",  # height 0: a leaf
            _file_table(path),
            _varint(len(keys)),
            _varints(prefixes),
            _varints(suffixes),
            b"".join(k[len(k) - s :] for k, s in zip(keys, suffixes)),
            _varints(lengths),
            b"\x01" * len(keys),  # value kind 1: out of line
            b"\x00" * len(keys),  # data file 0
            _varints(offsets),
        ]
    )
    return _framed(_BTREE_MAGIC, body)


def _manifest(path: bytes, node: tuple[int, int], keys: int, value_bytes: int) -> bytes:
    """The manifest of one version (generation 1) whose root is the leaf ``node``."""
    offset, length = node
    config = b"".join(
        [
            uuid.uuid4().bytes,
            b"\x00",  # manifest kind: a single manifest file
            _varint(0),  # max_inline_value_bytes: every value out of line
            _varint(max(_MAX_NODE, length)),
            bytes([_ARITY_LOG2]),
            b"\x00",  # uncompressed
        ]
    )
    version = b"".join(
        [
            b"\x01",  # one version
            b"\x01",  # generation number 1
            b"\x00",  # root height 0
            b"\x00",  # data file 0
            _varints([offset, length, keys, length, value_bytes]),
            struct.pack("<Q", time.time_ns()),  # commit time
        ]
    )
    return _framed(_MANIFEST_MAGIC, config + _file_table(path) + version + b"\x00")


def write_store(
    directory: Path,
    entries: Sequence[tuple[str, memoryview]],
    write_file: Callable[[Path, Sequence[memoryview]], None],
) -> None:
    """Write the OCDBT store of ``entries`` (distinct keys) into the new ``directory``.

    ``write_file(path, buffers)`` writes (and flushes) one new file; the data file gets
    every value, then the B+tree node; ``manifest.ocdbt`` is written last.
    """
    path = f"d/{uuid.uuid4().hex}".encode()
    order = sorted(range(len(entries)), key=lambda i: entries[i][0].encode())
    offsets, position = [0] * len(entries), 0
    for i, (_, value) in enumerate(entries):
        offsets[i] = position
        position += len(value)
    keys = [entries[i][0].encode() for i in order]
    lengths = [len(entries[i][1]) for i in order]
    node = _leaf_node(path, keys, [offsets[i] for i in order], lengths)
    (directory / "d").mkdir()
    write_file(directory / path.decode(), [*(value for _, value in entries), memoryview(node)])
    manifest = _manifest(path, (position, len(node)), len(keys), position)
    write_file(directory / "manifest.ocdbt", [memoryview(manifest)])

"""A cheap fingerprint of `fit`'s data, saved in each checkpoint to refuse a resume over other data.

It records what costs (almost) nothing to read: the number of batches when ``len()`` works, a
hash of the first batch of a list, and for a grain pipeline (a ``MapDataset``/``IterDataset``
or a ``DataLoader``) the length and a hash of the first record of each source it reads. A
plain iterator has none: nothing is read from it ahead of training.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any

import jax
import numpy as np

__all__ = ["fingerprint", "mismatch"]

_MAX_SOURCES = 16  # a pipeline mixing more sources is fingerprinted by its first 16


def _hash(item: Any) -> str | None:
    """A short hash of one batch or record (its leaves' dtypes, shapes and bytes), or None."""
    try:
        digest = hashlib.blake2b(digest_size=8)
        for leaf in jax.tree.leaves(item):
            array = np.asarray(leaf)
            if array.dtype == object:
                return None
            digest.update(f"{array.dtype.str}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()
    except Exception:  # a record that is not arrays: no hash, the length still counts
        return None


def _length(data: Any) -> int | None:
    try:
        return int(len(data)) if isinstance(data, Sized) else None
    except Exception:  # an infinite grain dataset raises on len()
        return None


def _grain_sources(data: Any) -> list[Any]:
    """The random-access sources a grain pipeline reads (none for anything else)."""
    source = getattr(data, "_data_source", None)  # a grain DataLoader
    if source is not None:
        return [source]
    parents = getattr(data, "parents", None)  # a grain MapDataset / IterDataset
    if not isinstance(parents, Sequence) or isinstance(parents, str):
        return []
    if not parents:
        return [data]
    found: list[Any] = []
    for parent in parents:
        found += _grain_sources(parent)
    return found[:_MAX_SOURCES]


def _describe(source: Any) -> dict[str, Any]:
    record: dict[str, Any] = {}
    length = _length(source)
    if length is not None:
        record["length"] = length
        try:
            first = _hash(source[0]) if length > 0 else None
        except Exception:  # a source that cannot be indexed cheaply
            first = None
        if first is not None:
            record["first"] = first
    return record


def fingerprint(batches: Iterable[Any]) -> dict[str, Any] | None:
    """What `fit` records of ``batches`` (JSON), or None when nothing can be read cheaply.

    Args:
        batches: `fit`'s ``batches``.

    Returns:
        ``{"length": n, "first": hash, "sources": [...]}``, each key present when known.

    Examples:
        >>> import numpy as np
        >>> fingerprint([np.zeros(2)] * 3)["length"]
        3
        >>> fingerprint(iter([1, 2])) is None
        True
    """
    record: dict[str, Any] = {}
    sources = _grain_sources(batches)
    if sources:
        described = [_describe(s) for s in sources]
        if any(described):
            record["sources"] = described
    length = _length(batches)
    if length is not None:
        record["length"] = length
        if isinstance(batches, Sequence) and length > 0 and not sources:
            first = _hash(batches[0])
            if first is not None:
                record["first"] = first
    return record or None


def mismatch(saved: Any, now: dict[str, Any] | None) -> str | None:
    """How the saved fingerprint differs from the current one (None: no difference known).

    Only what both record is compared: a fingerprint that could not be taken refuses nothing.

    Examples:
        >>> mismatch({"length": 256}, {"length": 200})
        'length 256 (now 200)'
        >>> mismatch({"length": 256}, None) is None
        True
    """
    if not isinstance(saved, Mapping) or now is None:
        return None
    for key in ("length", "first"):
        if key in saved and key in now and saved[key] != now[key]:
            return f"{'first batch hash' if key == 'first' else key} {saved[key]} (now {now[key]})"
    then, current = saved.get("sources"), now.get("sources")
    if isinstance(then, list) and isinstance(current, list):
        if len(then) != len(current):
            return f"{len(then)} data sources (now {len(current)})"
        for i, (a, b) in enumerate(zip(then, current, strict=True)):
            different = mismatch(a, b) if isinstance(b, dict) else None
            if different is not None:
                return f"a data source (#{i}) of {different.replace('first batch', 'first record')}"
    return None

"""A cheap fingerprint of `fit`'s data, saved in each checkpoint to refuse a resume over other data.

It records what costs (almost) nothing to read: the number of batches when ``len()`` works, a
hash of the first batch of a list, and for a grain pipeline (a ``MapDataset``/``IterDataset``
or a ``DataLoader``) what defines its order and content: each source's length, a hash of its
first record and of a sample of up to 256 records spread over it (every record of a source of
at most 256), and the pipeline's configuration, node by node (its kind, its scalar settings
such as seeds, shuffles, batch sizes and slices, and the names of its transformations; a
DataLoader's sampler and operations). A plain iterator has none: nothing is read from it
ahead of training. Every batch trained is hashed as well, as it is trained (`_trained`).

Fingerprints are compared key by key, only on what both record: a checkpoint saved before a
key existed (``"pipeline"``, ``"sample"``) resumes, checked on the keys it has.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence, Sized
from typing import Any

import jax
import numpy as np

__all__ = ["fingerprint", "mismatch"]

_MAX_SOURCES = 16  # a pipeline mixing more sources is fingerprinted by its first 16
_SAMPLE = 256  # records hashed per source (all of a smaller one)
_MAX_NODES = 64  # pipeline nodes described
_SCALARS = (bool, int, float, str, type(None))


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


def _sample(source: Any, length: int) -> tuple[str, int] | None:
    """A hash of up to `_SAMPLE` records spread evenly over ``source`` (first and last in)."""
    picks = np.unique(np.linspace(0, length - 1, min(length, _SAMPLE)).astype(np.int64))
    digest = hashlib.blake2b(digest_size=8)
    try:
        for i in picks:
            one = _hash(source[int(i)])
            if one is None:
                return None
            digest.update(one.encode())
    except Exception:  # a source that cannot be indexed
        return None
    return digest.hexdigest(), len(picks)


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
            sample = _sample(source, length)
            if sample is not None:
                record["sample"], record["sampled"] = sample
    return record


def _name(fn: Any) -> str:
    """A transformation as its module-qualified name (a grain ``Transform``: its class's)."""
    named = fn if callable(fn) and hasattr(fn, "__qualname__") else type(fn)
    return f"{getattr(named, '__module__', '?')}.{getattr(named, '__qualname__', '?')}"


def _settings(node: Any) -> dict[str, Any]:
    """A grain node's kind, scalar settings (seeds, sizes, slices) and transformation names.

    Performance options (threads, buffers, worker processes) change no record or order and
    are left out, so a resume may tune them.
    """
    out: dict[str, Any] = {"kind": type(node).__name__}
    for key, value in sorted(vars(node).items()):
        name = key.lstrip("_")
        if key in ("_parents", "_source", "_data_source") or name.startswith("original"):
            continue
        if isinstance(value, _SCALARS):
            if not isinstance(value, str) or len(value) <= 200:
                out[name] = value
        elif callable(value) and not isinstance(value, type):
            out[name] = _name(value)
        elif "shard" in name and hasattr(value, "__dataclass_fields__"):
            out[name] = {
                f: str(getattr(value, f, None)) for f in sorted(value.__dataclass_fields__)
            }
    return out


def _pipeline(data: Any) -> list[dict[str, Any]]:
    """The nodes of a grain pipeline, top down (a DataLoader: its sampler and operations)."""
    if getattr(data, "_data_source", None) is not None:  # a grain DataLoader
        sampler = getattr(data, "_sampler", None)
        nodes = [] if sampler is None else [_settings(sampler)]
        operations = getattr(data, "_operations", None) or []
        return nodes + [_settings(op) for op in list(operations)[:_MAX_NODES]]
    nodes: list[dict[str, Any]] = []
    stack = [data]
    while stack and len(nodes) < _MAX_NODES:
        node = stack.pop()
        parents = getattr(node, "parents", None)
        if not isinstance(parents, Sequence) or isinstance(parents, str):
            break
        try:
            nodes.append(_settings(node))
        except TypeError:  # no __dict__: its kind only
            nodes.append({"kind": type(node).__name__})
        stack.extend(reversed(parents))
    return nodes


def fingerprint(batches: Iterable[Any]) -> dict[str, Any] | None:
    """What `fit` records of ``batches`` (JSON), or None when nothing can be read cheaply.

    Args:
        batches: `fit`'s ``batches``.

    Returns:
        ``{"length": n, "first": hash, "sources": [...], "pipeline": [...]}``, each key
        present when known.

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
        record["pipeline"] = _pipeline(batches)
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
    for key, said in (("length", "length"), ("first", "first batch hash"), ("sample", _SAID)):
        if key in saved and key in now and saved[key] != now[key]:
            return f"{said} {saved[key]} (now {now[key]})"
    then, current = saved.get("sources"), now.get("sources")
    if isinstance(then, list) and isinstance(current, list):
        if len(then) != len(current):
            return f"{len(then)} data sources (now {len(current)})"
        for i, (a, b) in enumerate(zip(then, current, strict=True)):
            different = mismatch(a, b) if isinstance(b, dict) else None
            if different is not None:
                return f"a data source (#{i}) of {different.replace('first batch', 'first record')}"
    return _pipeline_mismatch(saved.get("pipeline"), now.get("pipeline"))


_SAID = "sampled-records hash"


def _pipeline_mismatch(then: Any, now: Any) -> str | None:
    """The first node of a grain pipeline whose kind or a setting both record differs."""
    if not isinstance(then, list) or not isinstance(now, list):
        return None
    if len(then) != len(now):
        kinds = [n.get("kind") for n in then if isinstance(n, Mapping)]
        return f"a grain pipeline of {len(then)} steps {kinds} (now {len(now)})"
    for i, (a, b) in enumerate(zip(then, now, strict=True)):
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            continue
        for key in sorted(set(a) & set(b), key=lambda k: k != "kind"):
            if a[key] != b[key]:
                return (
                    f"a grain pipeline whose step {i} ({a.get('kind')}) has {key} "
                    f"{a[key]!r} (now {b[key]!r})"
                )
    return None

"""What a checkpoint records of a pytree: its leaf table, static fields, strict JSON metadata.

Any pytree of arrays is saved (a `jaxwise.train.TrainState`, a Flax NNX ``nnx.State``, an
Equinox model's arrays from ``eqx.partition``, a dict): each leaf is one row of the table
(its dotted name, its key path, shape, dtype, and how it is stored: typed PRNG keys as
their raw ``uint32`` key data). A dataclass's static fields (a ``TrainState`` subclass's)
are recorded too, so that a checkpoint refuses a target built with another configuration.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import is_key
from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint._format import CheckpointError
from jaxwise.tree import path_names

__all__ = [
    "check_metadata",
    "check_static",
    "check_structure",
    "data_fingerprint",
    "jsonable_static",
    "leaf_rows",
    "signature",
    "step_of",
]


def _as_leaf(leaf: Any, name: str, what: str) -> Any:
    """``leaf`` as something with a shape and dtype (an array or ``ShapeDtypeStruct``)."""
    if isinstance(leaf, (jax.Array, np.ndarray, jax.ShapeDtypeStruct)):
        return leaf
    if isinstance(leaf, (bool, int, float, complex, np.generic)):
        return jnp.asarray(leaf)
    raise TypeError(
        f"`{what}` must be a pytree of arrays, got a {type(leaf).__name__} at `{name or '(root)'}`"
    )


def signature(tree: Any, what: str) -> list[tuple[str, tuple[int, ...], str, Any]]:
    """``(name, shape, dtype name, leaf)`` of every leaf of ``tree`` (``TypeError`` otherwise)."""
    out = []
    for name, leaf in zip(path_names(tree), jax.tree.leaves(tree)):
        leaf = _as_leaf(leaf, name, what)
        out.append((name, tuple(leaf.shape), str(leaf.dtype), leaf))
    return out


def leaf_rows(tree: Any) -> tuple[list[dict[str, Any]], list[Any]]:
    """(the leaf table of ``tree``, the arrays to store: typed keys as their key data)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    rows, stored = [], []
    for (path, leaf), name in zip(flat, path_names(tree)):
        leaf = _as_leaf(leaf, name, "tree")
        if isinstance(leaf, jax.ShapeDtypeStruct):
            raise TypeError(f"`tree` must hold arrays, got a ShapeDtypeStruct at `{name}`")
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
    return rows, stored


def step_of(tree: Any, step: Any) -> int:
    """The step to save ``tree`` as: ``step``, else ``tree.step`` (a `TrainState`'s)."""
    if isinstance(tree, (str, bytes)):
        raise TypeError(f"`tree` must be a pytree of arrays, got a {type(tree).__name__}")
    if step is None:
        step = getattr(tree, "step", None)
        if step is None:
            raise TypeError(
                f"`step` is required to save a {type(tree).__name__} (it has no `step` field): "
                "call save(tree, metadata, step=N)"
            )
    if isinstance(step, bool) or not isinstance(step, (int, np.integer, jax.Array, np.ndarray)):
        raise TypeError(f"`step` must be an int, got {type(step).__name__}")
    if np.ndim(step) != 0 or not jnp.issubdtype(np.asarray(step).dtype, np.integer):
        raise TypeError(f"`step` must be an int scalar, got {step!r}")
    value = int(step)
    if value < 0:
        raise ValueError(f"`step` must be >= 0, got {value}")
    return value


# ----------------------------------------------------------------------------- static fields


def _static_fields(tree: Any) -> dict[str, Any]:
    if not dataclasses.is_dataclass(tree) or isinstance(tree, type):
        return {}
    return {
        f.name: getattr(tree, f.name)
        for f in dataclasses.fields(tree)
        if f.metadata.get("static") and f.name != "tx"
    }


def jsonable_static(tree: Any) -> dict[str, Any]:
    """The static fields of a dataclass ``tree`` as JSON values (``{"repr": ...}`` otherwise).

    The optimizer (``tx``, a function) is not compared: its state is, leaf by leaf.
    """
    out = {}
    for name, value in _static_fields(tree).items():
        try:
            out[name] = json.loads(json.dumps(value, allow_nan=False))
        except (TypeError, ValueError):
            out[name] = {"repr": repr(value)}
    return out


def _old_config(saved: dict[str, Any], current: Mapping[str, Any]) -> dict[str, Any] | None:
    """An earlier `TrainState`'s ``config`` pairs (``[[name, value], ...]``) as named fields.

    Until the fifth round a `TrainState` kept its configuration in one static ``config`` of
    sorted ``(name, value)`` pairs; now each is a named static field of a subclass. A
    checkpoint that holds pairs restores into a subclass with those fields (and values).
    """
    pairs = saved.get("config")
    if "config" in current or not isinstance(pairs, list):
        return None
    if not all(isinstance(p, list) and len(p) == 2 and isinstance(p[0], str) for p in pairs):
        return None
    return {name: value for name, value in pairs}


def _subclass_advice(fields: Mapping[str, Any]) -> str:
    """How to write the subclass that restores an earlier `TrainState`'s ``config``."""
    lines = "; ".join(
        f"{name}: {type(value).__name__} = dataclasses.field(default={value!r}, "
        "metadata=dict(static=True))"
        for name, value in fields.items()
    )
    call = ", ".join(f"{name}={value!r}" for name, value in fields.items())
    return (
        "it was saved by an earlier TrainState whose `config` held "
        f"{', '.join(f'{k}={v!r}' for k, v in fields.items())}; configuration is now a named "
        "static field of a subclass: restore into one, @jax.tree_util.register_dataclass "
        f"@dataclasses.dataclass(frozen=True) class MyState(TrainState): {lines}, with "
        f"`like = MyState.create(params, tx, key, {call})`"
    )


def check_static(doc: Mapping[str, Any], like: Any) -> None:
    """``CheckpointError`` when the stored static fields differ from ``like``'s.

    An earlier `TrainState`'s ``config`` pairs are compared as the named static fields of a
    subclass (the error says how to write it); an empty ``config`` is no field at all.
    """
    saved, current = dict(doc.get("static", {})), jsonable_static(like)
    fields = _old_config(saved, current)
    if fields is not None:
        del saved["config"]
        missing = [k for k in fields if k not in current]
        if missing or any(current[k] != v for k, v in fields.items()):
            raise CheckpointError(
                f"the checkpoint does not fit `like` ({type(like).__name__}): "
                + _subclass_advice(fields)
            )
        saved.update(fields)
    for name in sorted(set(saved) | set(current)):
        if saved.get(name) != current.get(name):
            raise CheckpointError(
                f"the checkpoint was saved with static `{name}` = {saved.get(name)!r}, but "
                f"`like` has {current.get(name)!r}; restore into a state created with the same "
                "configuration"
            )


def check_structure(rows: Sequence[Mapping[str, Any]], like: Any) -> list[Any]:
    """``like``'s leaves when the table ``rows`` has its paths, shapes and dtypes, in order.

    Raises:
        CheckpointError: naming the first differing path (or the first extra one).
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(like)
    target = [
        (name, shape, dtype, leaf, list(fmt.stored_parts(path)))
        for (name, shape, dtype, leaf), (path, _) in zip(signature(like, "like"), flat)
    ]
    for row, (name, shape, dtype, _, parts) in zip(rows, target):
        if row["name"] != name or row["path"] != parts:
            raise CheckpointError(
                f"first differing path: checkpoint has `{row['name']}`, `like` has `{name}`"
            )
        if tuple(row["shape"]) != shape or row["dtype"] != dtype:
            raise CheckpointError(
                f"at `{name}`: checkpoint {row['dtype']}{list(row['shape'])}, "
                f"`like` {dtype}{list(shape)}"
            )
    if len(rows) != len(target):
        which, extra = (
            ("checkpoint", rows[len(target)]["name"])
            if len(rows) > len(target)
            else ("`like`", target[len(rows)][0])
        )
        raise CheckpointError(f"{which} has extra path `{extra}`")
    return [leaf for _, _, _, leaf, _ in target]


# ----------------------------------------------------------------------------- strict metadata


def _first_non_json(value: Any, where: str) -> str | None:
    """Why ``value`` (at ``where``) is not strict JSON, or None."""
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"`{where}` is {value!r} (not JSON)"
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            found = _first_non_json(item, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"`{where}` has the non-string key {key!r}"
            found = _first_non_json(item, f"{where}[{key!r}]")
            if found:
                return found
        return None
    return f"`{where}` is a {type(value).__name__}"


def check_metadata(metadata: Any) -> dict[str, Any]:
    """A copy of ``metadata`` when it is a strict-JSON dict (no NaN/inf, string keys).

    Raises:
        TypeError: not a dict, or a value JSON cannot hold (named by its key path).
        ValueError: a NaN or infinite float (named by its key path).

    Examples:
        >>> check_metadata({"loss": float("nan")})
        Traceback (most recent call last):
        ...
        ValueError: `metadata` must be strict JSON: `metadata['loss']` is nan (not JSON); ...
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(f"`metadata` must be a dict or None, got {type(metadata).__name__}")
    problem = _first_non_json(metadata, "metadata")
    if problem is None:
        return json.loads(json.dumps(metadata, allow_nan=False))
    if "(not JSON)" in problem:
        raise ValueError(
            f"`metadata` must be strict JSON: {problem}; store a string or None instead"
        )
    raise TypeError(f"`metadata` must be JSON-serialisable: {problem}")


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

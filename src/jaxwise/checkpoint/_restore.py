"""Reading checkpoint trees onto ``like``'s shardings (jaxwise steps, plain orbax pytrees)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._checks import is_key
from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint._format import CheckpointError, Damaged
from jaxwise.train import TrainState, type_signature
from jaxwise.tree import path_names


def _sharding_of(leaf: Any) -> jax.sharding.Sharding:
    sharding = getattr(leaf, "sharding", None)
    if isinstance(sharding, jax.sharding.Sharding):
        return sharding
    return jax.sharding.SingleDeviceSharding(jax.local_devices()[0])


def _pytree_restore(item_dir: Path, target: Any) -> Any:
    ocp = fmt.orbax()
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            return checkpointer.restore(item_dir, target)
    except Exception as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise Damaged(f"its files are unreadable ({type(err).__name__}: {first})") from None


def _check_structure(doc: dict[str, Any], like: TrainState) -> None:
    rows = doc["leaves"]
    flat, _ = jax.tree_util.tree_flatten_with_path(like)
    target = [
        (n, tuple(s), d, list(fmt.stored_parts(p)))
        for (n, s, d, _), (p, _) in zip(type_signature(like), flat)
    ]
    for row, (name, shape, dtype, parts) in zip(rows, target):
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


def restore_jaxwise(item_dir: Path, doc: dict[str, Any], like: TrainState) -> TrainState:
    """Restore a jaxwise ``state`` item described by its sealed ``doc`` into ``like``."""
    _check_structure(doc, like)
    rows, like_leaves = doc["leaves"], jax.tree.leaves(like)
    target = fmt.nest(
        [
            (
                tuple(row["path"]),
                jax.ShapeDtypeStruct(
                    tuple(row["stored_shape"]),
                    np.dtype(row["stored_dtype"]),
                    sharding=_sharding_of(leaf),
                ),
            )
            for row, leaf in zip(rows, like_leaves)
        ]
    )
    restored = _pytree_restore(item_dir, target)
    values = [fmt.lookup(restored, row["path"]) for row in rows]
    for row, checksum in zip(rows, fmt.checksums(values)):
        if checksum != row["checksum"]:
            raise Damaged(f"`{row['name']}` fails its checksum (corrupted data)")
    leaves = [
        jax.random.wrap_key_data(v, impl=row["key_impl"]) if row["key_impl"] else v
        for row, v in zip(rows, values)
    ]
    return jax.tree.unflatten(jax.tree.structure(like), leaves)


def _orbax_tree(item_dir: Path) -> Any:
    ocp = fmt.orbax()
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            meta = checkpointer.metadata(item_dir)
    except Exception as err:
        raise Damaged(f"its orbax metadata is unreadable ({type(err).__name__})") from None
    return getattr(getattr(meta, "item_metadata", meta), "tree", meta)


def _is_meta_leaf(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype")


def _match(stored: Any, like: TrainState) -> dict[tuple[str, ...], Any]:
    """Map the checkpoint's leaf paths to ``like``'s leaves (by their plain key strings)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(stored, is_leaf=_is_meta_leaf)
    stored_paths = {fmt.raw_parts(p) for p, _ in flat}
    like_flat, _ = jax.tree_util.tree_flatten_with_path(like)
    wanted = {fmt.raw_parts(p): leaf for p, leaf in like_flat}
    dotted: dict[str, tuple[str, ...]] = {}
    for parts in wanted:
        other = dotted.setdefault(".".join(parts), parts)
        if other != parts:
            raise CheckpointError(
                f"`like` has paths {list(other)} and {list(parts)} that plain orbax stores under "
                f"the same name `{'.'.join(parts)}` (it joins keys with dots), so this checkpoint "
                "cannot hold both; "
                "save with jaxwise.checkpoint.save, which escapes such keys"
            )
    for parts, leaf in wanted.items():
        if parts not in stored_paths and not (parts == ("key",) and is_key(leaf)):
            raise CheckpointError(f"the checkpoint has no `{'.'.join(parts)}`")
    extra = sorted(stored_paths - set(wanted))
    if extra:
        raise CheckpointError(f"the checkpoint has extra path `{'.'.join(extra[0])}`")
    return wanted


def _target_leaf(meta: Any, leaf: Any, name: str) -> Any:
    shape, dtype = tuple(meta.shape), np.dtype(meta.dtype) if not is_key(meta) else meta.dtype
    want = tuple(leaf.shape) + ((2,) if is_key(leaf) and not is_key(meta) else ())
    if shape != want:
        raise CheckpointError(f"at `{name}`: checkpoint shape {list(shape)}, `like` {list(want)}")
    if not is_key(leaf) and dtype != leaf.dtype:
        both_int = jnp.issubdtype(dtype, jnp.integer) and jnp.issubdtype(leaf.dtype, jnp.integer)
        if not (both_int and shape == ()):
            raise CheckpointError(f"at `{name}`: checkpoint {dtype}, `like` {leaf.dtype}")
        dtype = leaf.dtype  # e.g. Flax's Python-int step, stored as int64
    return jax.ShapeDtypeStruct(shape, dtype, sharding=_sharding_of(leaf))


def restore_orbax(item_dir: Path, like: TrainState) -> TrainState:
    """Restore a plain orbax/Flax pytree checkpoint with ``like``'s tree (no integrity data)."""
    stored = _orbax_tree(item_dir)
    wanted = _match(stored, like)
    target = jax.tree_util.tree_map_with_path(
        lambda p, m: _target_leaf(m, wanted[fmt.raw_parts(p)], ".".join(fmt.raw_parts(p))),
        stored,
        is_leaf=_is_meta_leaf,
    )
    restored = _pytree_restore(item_dir, target)
    like_flat, treedef = jax.tree_util.tree_flatten_with_path(like)
    leaves = []
    for (path, leaf), name in zip(like_flat, path_names(like)):
        parts = fmt.raw_parts(path)
        try:
            value = fmt.lookup(restored, parts)
        except (KeyError, IndexError):
            leaves.append(leaf)  # a key that plain Flax states do not have: keep `like`'s
            continue
        if is_key(leaf) and not is_key(value):
            value = jax.random.wrap_key_data(value, impl=jax.random.key_impl(leaf))
        elif not is_key(leaf) and value.dtype != leaf.dtype:
            raise CheckpointError(f"at `{name}`: checkpoint {value.dtype}, `like` {leaf.dtype}")
        leaves.append(value)
    return jax.tree.unflatten(treedef, leaves)

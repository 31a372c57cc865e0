"""Restoring a checkpoint onto ``like``'s structure and shardings (any pytree).

Four kinds of step are read: jaxwise's single-process format (an orbax pytree item it
writes itself, or the single data file written before the sixth round), its multi-process
format (an orbax pytree item written by orbax, beside the sealed metadata) and plain
orbax/Flax pytree checkpoints (no integrity data).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._checks import check_int, check_path, is_key
from jaxwise._shared._interrupt import signals_held
from jaxwise.checkpoint import _format as fmt
from jaxwise.checkpoint import _native as native
from jaxwise.checkpoint._format import CheckpointError, CheckpointWarning, Damaged
from jaxwise.checkpoint._leaves import check_static, check_structure, signature
from jaxwise.checkpoint._native import sharding_of
from jaxwise.checkpoint._steps import Foreign, candidates, check_identity, check_run_id, read_meta
from jaxwise.tree import path_names


def _pytree_restore(item_dir: Path, target: Any) -> Any:
    ocp = fmt.orbax()
    try:
        with ocp.StandardCheckpointer() as checkpointer:
            return checkpointer.restore(item_dir, target)
    except Exception as err:
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise Damaged(f"its files are unreadable ({type(err).__name__}: {first})") from None


def _restore_orbax_item(item_dir: Path, doc: dict[str, Any], like: Any) -> Any:
    """Restore a format-2 ``state`` item (an orbax pytree) described by its sealed ``doc``."""
    rows, like_leaves = doc["leaves"], check_structure(doc["leaves"], like)
    target = fmt.nest(
        [
            (
                tuple(row["path"]),
                jax.ShapeDtypeStruct(
                    tuple(row["stored_shape"]),
                    np.dtype(row["stored_dtype"]),
                    sharding=sharding_of(leaf),
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


def _match(stored: Any, like: Any) -> dict[tuple[str, ...], Any]:
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
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding_of(leaf))


def restore_orbax(item_dir: Path, like: Any) -> Any:
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


def _restore_one(step_dir: Path, number: int | None, like: Any, run_id: str | None) -> Any:
    found = fmt.layout(step_dir)
    if found is None:
        raise Damaged("it is incomplete (an interrupted write or a stray directory)")
    kind, item_dir = found
    if kind == "orbax":
        if run_id is not None:
            raise Foreign("written by plain orbax, not by this run")
        return restore_orbax(item_dir, like)
    doc = read_meta(step_dir)
    check_identity(doc, number, run_id)
    check_static(doc, like)
    if doc["format"] in native.FORMATS:
        leaves = native.read_leaves(step_dir, doc, check_structure(doc["leaves"], like))
        return jax.tree.unflatten(jax.tree.structure(like), leaves)
    return _restore_orbax_item(item_dir / fmt.STATE, doc, like)


def restore(
    path: str | Path, like: Any, step: int | None = None, *, run_id: str | None = None
) -> Any:
    """Restore a checkpoint into ``like``'s structure, placing every array on ``like``'s sharding.

    ``like`` is any pytree of arrays (or ``jax.ShapeDtypeStruct`` leaves): a
    [`TrainState`][jaxwise.train.TrainState], a Flax NNX ``nnx.State``, an Equinox
    model's arrays. By default the newest step is restored; a step that is incomplete
    (a stray or half-written directory), damaged (unreadable files, a leaf failing its
    checksum, metadata failing its digest) or not the run's (a renamed or copied step
    directory; with ``run_id``, another run's step) is skipped with one
    `CheckpointWarning` naming it and the reason, and the newest intact step is
    restored. With an explicit ``step`` such a step is an error. The checkpoint must have
    ``like``'s paths, shapes, dtypes and static fields (else `CheckpointError` naming the
    first difference). Works in every process of a ``jax.distributed`` job (``like``
    sharded over a global mesh), and reads plain orbax/Flax checkpoints with the same tree
    (``path`` a pytree directory or a directory of steps; a missing ``key`` is taken from
    ``like``). The metadata of a step is read with
    [`load_metadata`][jaxwise.checkpoint.load_metadata].

    Resuming is bit-identical: training N epochs straight equals k epochs, save, restore
    (in a fresh process) and N − k more.

    Args:
        path: the checkpoint directory.
        like: a pytree of arrays or ``jax.ShapeDtypeStruct`` leaves giving the structure,
            dtypes and target shardings.
        step: the step to restore (default: the newest intact one).
        run_id: take only the steps this run wrote (see
            [`Checkpointer`][jaxwise.checkpoint.Checkpointer]).

    Returns:
        The restored tree, of ``like``'s structure.

    Raises:
        CheckpointError: no checkpoint, no usable step (each one named with its reason), a
            damaged explicit ``step``, or a checkpoint that does not fit ``like``.
        TypeError: ``like`` is not a pytree of arrays or ``step`` not an int.

    Examples:
        >>> import tempfile, jax.numpy as jnp
        >>> from jaxwise.checkpoint import save
        >>> directory = tempfile.mkdtemp()
        >>> _ = save(directory, {"w": jnp.ones(2)}, step=1)
        >>> restore(directory, like={"w": jnp.zeros(2)})["w"].tolist()
        [1.0, 1.0]
    """
    check_path(path, "path")
    signature(like, "like")
    if step is not None:
        step = check_int(step, "step", min_value=0)
    run_id = check_run_id(run_id)
    fmt.orbax()
    fmt.quiet_orbax()
    root = Path(path).absolute()
    problems: list[str] = []
    damaged_only = True
    for number, step_dir in candidates(root, step):
        label = "the checkpoint" if number is None else f"checkpoint step {number}"
        try:
            with signals_held():
                tree = _restore_one(step_dir, number, like, run_id)
        except (Damaged, Foreign) as err:
            if step is not None or number is None:
                what = "is damaged" if isinstance(err, Damaged) else "is not this run's"
                raise CheckpointError(f"{label} in {root} {what}: {err}") from None
            damaged_only = damaged_only and isinstance(err, Damaged)
            problems.append(f"step {number} ({err})")
            continue
        except CheckpointError as err:
            raise CheckpointError(f"{label} in {root} does not fit `like`: {err}") from None
        if problems:
            warnings.warn(
                f"skipped {'damaged ' if damaged_only else ''}checkpoint {'; '.join(problems)} "
                f"in {root}; restored step {number}",
                CheckpointWarning,
                stacklevel=2,
            )
        return tree
    raise CheckpointError(f"no intact checkpoint in {root}: {'; '.join(problems)}")

"""Meshes and placement: data parallelism (one or many processes), FSDP-style parameter sharding."""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

__all__ = [
    "batch_sharding",
    "data_mesh",
    "data_size",
    "place_batch",
    "place_state",
    "replicated",
]


def data_mesh(devices: Any = None) -> Mesh:
    """A 1-D mesh with axis ``"data"`` over ``devices`` (default: all devices of every process).

    In a single process this is every local device; in a ``jax.distributed``
    job it spans the devices of all processes (the global mesh every process
    must build identically).

    Example:
        >>> data_mesh().axis_names
        ('data',)
    """
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), ("data",))


def data_size(mesh: Mesh | None) -> int:
    """The number of devices along the mesh's ``"data"`` axis (1 without a mesh).

    Example:
        >>> data_size(None)
        1
    """
    return 1 if mesh is None else int(mesh.shape["data"])


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding that keeps a full copy on every device of ``mesh``.

    Example:
        >>> replicated(data_mesh()).spec
        P()
    """
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding that splits the leading (example) axis over the mesh's ``"data"`` axis.

    Example:
        >>> batch_sharding(data_mesh()).spec
        P('data',)
    """
    return NamedSharding(mesh, P("data"))


def _is_key(leaf: Any) -> bool:
    return isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)


def _fresh_copies(arrays: list[Any], impls: tuple[str | None, ...]) -> list[Any]:
    """Copies (and typed keys from key data): fresh buffers on each device."""
    return [
        jax.random.wrap_key_data(a, impl=impl) if impl else jnp.copy(a)
        for a, impl in zip(arrays, impls)
    ]


@functools.lru_cache(maxsize=32)
def _copy_program(impls: tuple[str | None, ...], shardings: tuple[Any, ...]) -> Any:
    return jax.jit(_fresh_copies, static_argnums=1, out_shardings=list(shardings))


def _place_global(leaves: list[Any], shardings: list[Any]) -> list[Any]:
    """Multi-process placement: every process holds the full value and builds its own shards.

    ``make_array_from_callback`` may alias the host buffers (on CPU two local devices can
    share one), so one compiled copy per state structure gives every device its own buffer.
    """
    raw, impls = [], []
    for leaf, sharding in zip(leaves, shardings):
        impls.append(str(jax.random.key_impl(leaf)) if _is_key(leaf) else None)
        host = np.asarray(jax.random.key_data(leaf) if _is_key(leaf) else leaf)
        raw.append(jax.make_array_from_callback(host.shape, sharding, lambda i, h=host: h[i]))
    return _copy_program(tuple(impls), tuple(shardings))(raw, tuple(impls))


def place_state(state: Any, sharding: Any) -> Any:
    """Put every leaf of ``state`` on ``sharding`` (one sharding, or a matching tree of them).

    Works in a multi-process ``jax.distributed`` job, where ``jax.device_put``
    onto a mesh with devices of other processes fails ("must represent
    addressable devices"): there each process must hold the same full value
    (e.g. the same initialisation from the same seed) and contributes its
    addressable shards. Leaves already on their sharding are kept as they are.

    Example:
        >>> import jax.numpy as jnp
        >>> mesh = data_mesh()
        >>> placed = place_state({"w": jnp.zeros(3)}, replicated(mesh))
        >>> placed["w"].sharding == replicated(mesh)
        True
    """
    leaves, treedef = jax.tree.flatten(state)
    if isinstance(sharding, jax.sharding.Sharding):
        shardings = [sharding] * len(leaves)
    else:
        shardings = treedef.flatten_up_to(sharding)
    todo = [
        i
        for i, (leaf, s) in enumerate(zip(leaves, shardings))
        if not (isinstance(leaf, jax.Array) and leaf.sharding == s)
    ]
    if all(shardings[i].is_fully_addressable for i in todo):
        placed = [jax.device_put(leaves[i], shardings[i]) for i in todo]
    else:
        placed = _place_global([leaves[i] for i in todo], [shardings[i] for i in todo])
    for i, value in zip(todo, placed):
        leaves[i] = value
    return jax.tree.unflatten(treedef, leaves)


def place_batch(batch: Any, sharding: NamedSharding) -> Any:
    """Put a batch on ``sharding`` (usually :func:`batch_sharding`).

    In one process ``batch`` is the global batch. In a multi-process job each
    process passes ITS OWN slice of the global batch (its local examples, the
    leading axis split across processes in process order) and the global array
    is assembled with ``jax.make_array_from_process_local_data``; leaves that
    already are global arrays on ``sharding`` are kept.

    Example:
        >>> import numpy as np
        >>> mesh = data_mesh()
        >>> x = place_batch(np.ones((8, 2), np.float32), batch_sharding(mesh))
        >>> x.shape, x.sharding == batch_sharding(mesh)
        ((8, 2), True)
    """

    def put(leaf: Any) -> Any:
        if isinstance(leaf, jax.Array) and leaf.sharding == sharding:
            return leaf
        if sharding.is_fully_addressable:
            return jax.device_put(leaf, sharding)
        return jax.make_array_from_process_local_data(sharding, np.asarray(leaf))

    return jax.tree.map(put, batch)

"""Meshes and placement: data parallelism (one or many processes), FSDP-style parameter sharding."""

from __future__ import annotations

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


def _host_value(leaf: Any) -> Any:
    """A host (NumPy) copy of a leaf that every process holds in full."""
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        return leaf  # typed keys are handled by ``_place_leaf``
    return np.asarray(leaf)


def _place_leaf(leaf: Any, sharding: Any) -> Any:
    if isinstance(leaf, jax.Array) and leaf.sharding == sharding:
        return leaf
    if sharding.is_fully_addressable:
        return jax.device_put(leaf, sharding)
    # Multi-process: every process holds the full value; each builds its addressable shards from it.
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        data = _place_leaf(jax.random.key_data(leaf), sharding)
        return jax.jit(
            lambda d: jax.random.wrap_key_data(d, impl=jax.random.key_impl(leaf)),
            out_shardings=sharding,
        )(data)
    value = _host_value(leaf)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


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
    if isinstance(sharding, jax.sharding.Sharding):
        return jax.tree.map(lambda leaf: _place_leaf(leaf, sharding), state)
    return jax.tree.map(_place_leaf, state, sharding)


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

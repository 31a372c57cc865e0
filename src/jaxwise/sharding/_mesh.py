"""Meshes and placement: data parallelism (one or many processes), FSDP-style parameter sharding."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwise._shared._checks import check_int, is_key

T = TypeVar("T")

__all__ = [
    "batch_sharding",
    "data_mesh",
    "fsdp_mesh",
    "place_state",
    "replicated",
    "state_shardings",
]


def data_mesh(devices: Sequence[Any] | None = None) -> Mesh:
    """A 1-D mesh with axis ``"data"`` over ``devices`` (default: all devices of every process).

    In a single process this is every local device; in a ``jax.distributed``
    job it spans the devices of all processes (the global mesh every process
    must build identically).

    Args:
        devices: the devices, in mesh order; ``None`` for ``jax.devices()``.

    Returns:
        The mesh.

    Raises:
        TypeError: ``devices`` is not a list of JAX devices.
        ValueError: ``devices`` is empty.

    Examples:
        >>> data_mesh().axis_names
        ('data',)
    """
    if devices is not None:
        if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
            raise TypeError(f"`devices` must be a list of jax devices, got {devices!r}")
        devices = list(devices)
        if not devices:
            raise ValueError("`devices` must not be empty")
        if not all(isinstance(d, jax.Device) for d in devices):
            raise TypeError(f"`devices` must be a list of jax devices, got {devices!r}")
    devices = jax.devices() if devices is None else list(devices)
    return Mesh(np.asarray(devices), ("data",))


def replicated(mesh: Mesh) -> NamedSharding:
    """The sharding that keeps a full copy on every device of ``mesh``.

    Args:
        mesh: any mesh.

    Returns:
        ``NamedSharding(mesh, P())``.

    Examples:
        >>> replicated(data_mesh()).spec
        P()
    """
    return NamedSharding(mesh, P())


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """The sharding that splits the leading (example) axis over the mesh's ``"data"`` axis.

    Args:
        mesh: a mesh with a ``"data"`` axis.

    Returns:
        ``NamedSharding(mesh, P("data"))``.

    Examples:
        >>> batch_sharding(data_mesh()).spec
        P('data',)
    """
    return NamedSharding(mesh, P("data"))


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
    """Multi-process placement: every process holds the full value and builds its own shards
    (global arrays on another layout are resharded).

    ``make_array_from_callback`` may alias the host buffers (on CPU two local devices can
    share one), so one compiled copy per state structure gives every device its own buffer.
    """
    raw, impls = [], []
    for leaf, sharding in zip(leaves, shardings):
        impls.append(str(jax.random.key_impl(leaf)) if is_key(leaf) else None)
        data = jax.random.key_data(leaf) if is_key(leaf) else leaf
        if isinstance(data, jax.Array) and not data.is_fully_addressable:
            raw.append(data)  # already a global array: the compiled copy reshards it
            continue
        host = np.asarray(data)
        raw.append(jax.make_array_from_callback(host.shape, sharding, lambda i, h=host: h[i]))
    return _copy_program(tuple(impls), tuple(shardings))(raw, tuple(impls))


def place_state(state: T, sharding: jax.sharding.Sharding | Any) -> T:
    """Put every leaf of ``state`` on ``sharding`` (one sharding, or a matching tree of them).

    Works in a multi-process ``jax.distributed`` job, where ``jax.device_put``
    onto a mesh with devices of other processes fails ("must represent
    addressable devices"): there each process must hold the same full value
    (e.g. the same initialisation from the same seed) and contributes its
    addressable shards. Leaves already on their sharding are kept as they are.

    Args:
        state: any pytree of arrays (a ``TrainState``, parameters, …).
        sharding: one ``jax.sharding.Sharding`` for every leaf, or a tree of them matching
            ``state`` (e.g. from [`state_shardings`][jaxwise.sharding.state_shardings]).

    Returns:
        ``state`` with every leaf a ``jax.Array`` on its sharding.

    Examples:
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


def fsdp_mesh(model: int, devices: Sequence[Any] | None = None) -> Mesh:
    """A 2-D mesh ``("data", "model")`` with ``model`` devices along ``"model"``.

    Give it to ``make_train_step(..., mesh=...)``: batches are split over ``"data"``
    and every large parameter and optimizer-state leaf over ``"model"`` (see
    [`state_shardings`][jaxwise.sharding.state_shardings]), so each device holds about
    ``1/model`` of them.

    Args:
        model: devices per parameter shard; must divide the number of devices.
        devices: the devices (default: every device of every process).

    Returns:
        The mesh, of shape ``(len(devices) // model, model)``.

    Raises:
        TypeError: ``model`` is not an int.
        ValueError: ``model < 1`` or it does not divide the number of devices.

    Examples:
        >>> fsdp_mesh(1).axis_names
        ('data', 'model')
    """
    devices = jax.devices() if devices is None else list(devices)
    model = check_int(model, "model", min_value=1)
    if len(devices) % model:
        raise ValueError(f"`model` ({model}) must divide the number of devices ({len(devices)})")
    return Mesh(np.asarray(devices).reshape(len(devices) // model, model), ("data", "model"))


def _leaf_spec(leaf: Any, model: int, min_size: int) -> P:
    shape = tuple(getattr(leaf, "shape", ()))
    if model == 1 or int(np.prod(shape, dtype=np.int64)) < min_size or is_key(leaf):
        return P()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):  # largest divisible dim
        if shape[dim] % model == 0:
            return P(*([None] * dim), "model")
    return P()


def state_shardings(
    state: Any, mesh: Mesh | jax.sharding.AbstractMesh, *, min_size: int = 1024
) -> Any:
    """FSDP-style shardings for every leaf of ``state`` (a tree of ``NamedSharding``).

    A leaf with at least ``min_size`` elements is split along its largest dimension
    divisible by the mesh's ``"model"`` axis; everything else (scalars, small or
    indivisible leaves, PRNG keys) is replicated. Parameters and the optimizer moments
    that mirror them get the same layout. Without a ``"model"`` axis all are replicated
    (plain data parallelism). Works on arrays, tracers and ``jax.ShapeDtypeStruct``.

    Args:
        state: any pytree of arrays (or of ``jax.ShapeDtypeStruct``).
        mesh: a mesh (concrete or abstract), with or without a ``"model"`` axis.
        min_size: leaves with fewer elements stay replicated.

    Returns:
        A tree of ``NamedSharding`` with ``state``'s structure.

    Raises:
        TypeError: ``mesh`` is not a mesh, or ``min_size`` not an int.
        ValueError: ``min_size < 0``.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jax.sharding import AbstractMesh
        >>> mesh = AbstractMesh((2, 2), ("data", "model"))  # or fsdp_mesh(2) on 4 devices
        >>> specs = state_shardings({"w": jnp.zeros((64, 32)), "b": jnp.zeros(32)}, mesh)
        >>> specs["w"].spec, specs["b"].spec
        (P('model',), P())
    """
    if not isinstance(mesh, (Mesh, jax.sharding.AbstractMesh)):
        raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {type(mesh).__name__}")
    check_int(min_size, "min_size", min_value=0)
    model = int(dict(mesh.shape).get("model", 1))
    return jax.tree.map(lambda leaf: NamedSharding(mesh, _leaf_spec(leaf, model, min_size)), state)

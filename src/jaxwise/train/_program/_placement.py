"""Where a training program puts its state and batch on a mesh: the helpers `jaxwise.train` uses.

Built on `jaxwise.sharding`'s public placement (`state_shardings`, `place_state`); shared by
the step and the epoch programs.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import Mesh

from jaxwise.sharding import place_state, state_shardings

__all__ = ["constrain_state", "data_size", "feeding_processes", "keep_layout", "place_for_mesh"]


def data_size(mesh: Mesh | None) -> int:
    """The number of devices along the mesh's ``"data"`` axis (1 without a mesh).

    Examples:
        >>> data_size(None)
        1
    """
    return 1 if mesh is None else int(mesh.shape["data"])


def constrain_state(state: Any, mesh: Mesh | None) -> Any:
    """Inside ``jit``: pin ``state`` to `state_shardings` (identity without a "model" axis).

    Applied to a step's output state, it keeps the layout of the input, so the next call
    finds the same shardings and the step compiles once.
    """
    if mesh is None or "model" not in mesh.axis_names:
        return state
    return jax.lax.with_sharding_constraint(state, state_shardings(state, mesh))


def keep_layout(fn: Any, mesh: Mesh | None) -> Any:
    """Wrap a program ``fn(state, data) -> (state, out)`` so its output state keeps its layout.

    With a ``"model"`` axis the output state is pinned to `state_shardings` (the input
    layout), so donation reuses the buffers and the next call compiles nothing; otherwise
    ``fn`` is returned unchanged.
    """
    if mesh is None or "model" not in mesh.axis_names:
        return fn

    def program(state: Any, data: Any) -> Any:
        new_state, out = fn(state, data)
        return constrain_state(new_state, mesh), out

    return program


def place_for_mesh(state: Any, mesh: Mesh) -> Any:
    """Place ``state`` for a step on ``mesh``: replicated, or the FSDP layout with a "model" axis.

    Examples:
        >>> import jax.numpy as jnp
        >>> from jaxwise.sharding import data_mesh
        >>> placed = place_for_mesh({"w": jnp.zeros(3)}, data_mesh())
        >>> placed["w"].sharding.spec
        P()
    """
    return place_state(state, state_shardings(state, mesh))


def feeding_processes(batch: Any, mesh: Mesh) -> int:
    """How many processes each pass their own slice of ``batch`` to a step on ``mesh``.

    1 in a single process, or when every leaf already is a global array; otherwise the
    number of processes whose devices the mesh spans (each passes its local rows).

    Examples:
        >>> import numpy as np
        >>> from jaxwise.sharding import data_mesh
        >>> feeding_processes(np.zeros((8, 2)), data_mesh())
        1
    """
    processes = len({d.process_index for d in mesh.devices.flat})
    leaves = jax.tree.leaves(batch)
    if processes == 1 or all(
        isinstance(x, jax.Array) and not x.is_fully_addressable for x in leaves
    ):
        return 1
    return processes

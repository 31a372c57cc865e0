"""Meshes and placement: data parallelism (one or many processes) and FSDP-style sharding.

Give a mesh to `jaxwise.train.make_train_step` or `jaxwise.train.make_train_epoch`
(``mesh=...``): batches are split over its ``"data"`` axis and, with a ``"model"`` axis,
every large parameter and optimizer-state leaf over ``"model"``. The placement helpers work
in a multi-process ``jax.distributed`` job, where ``jax.device_put`` onto a global mesh
fails.

Examples:
    >>> import jax.numpy as jnp
    >>> from jaxwise.sharding import data_mesh, place_state, replicated
    >>> mesh = data_mesh()
    >>> mesh.axis_names
    ('data',)
    >>> place_state({"w": jnp.zeros(3)}, replicated(mesh))["w"].sharding.spec
    P()
"""

from jaxwise._shared._prefetch import place_batch
from jaxwise.sharding._mesh import (
    batch_sharding,
    data_mesh,
    fsdp_mesh,
    place_state,
    replicated,
    state_shardings,
)

__all__ = [
    "batch_sharding",
    "data_mesh",
    "fsdp_mesh",
    "place_batch",
    "place_state",
    "replicated",
    "state_shardings",
]

"""Checkpoints of any pytree of arrays: atomic, integrity-checked, locked, asynchronous.

A [`TrainState`][jaxwise.train.TrainState], a Flax NNX ``nnx.State``, an Equinox model's
arrays or a plain dict is saved as one step directory: the leaves as an orbax pytree item
(plain ``ocp.StandardCheckpointer().restore(<step>/state)`` reads it) and a sealed table of
leaves with a checksum each; a damaged step is skipped on restore, a
directory has one writer at a time, and arrays are restored onto the target's shardings
(also across the processes of a ``jax.distributed`` job, whose steps go through orbax).
Plain orbax/Flax checkpoints are read too, and `export_orbax` writes a saved step as a
plain orbax pytree with its nesting (for orbax-based tools). Needs the ``checkpoint`` extra
(``pip install 'jaxwise[checkpoint]'``, orbax-checkpoint).

Examples:
    >>> import tempfile, jax.numpy as jnp
    >>> from jaxwise import optim
    >>> from jaxwise.checkpoint import load_metadata, restore, save
    >>> from jaxwise.train import TrainState
    >>> state = TrainState.create({"w": jnp.ones(2)}, optim.sgd(0.1), 0)
    >>> directory = tempfile.mkdtemp()
    >>> _ = save(directory, state, {"epoch": 0})
    >>> restore(directory, like=state).params["w"].tolist(), load_metadata(directory)
    ([1.0, 1.0], {'epoch': 0})
"""

from jaxwise.checkpoint._checkpointer import Checkpointer, save
from jaxwise.checkpoint._export import export_orbax
from jaxwise.checkpoint._format import CheckpointError, CheckpointWarning
from jaxwise.checkpoint._leaves import data_fingerprint
from jaxwise.checkpoint._restore import restore
from jaxwise.checkpoint._steps import latest_step, load_metadata

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "Checkpointer",
    "data_fingerprint",
    "export_orbax",
    "latest_step",
    "load_metadata",
    "restore",
    "save",
]

"""Checkpoints of a `jaxwise.train.TrainState` as orbax pytrees: integrity-checked, locked.

Each step is an orbax pytree that keeps the state's nesting (readable with plain orbax),
with a sealed table of leaves and checksums; a damaged step is skipped on restore, a
directory has one writer at a time, and arrays are restored onto the target's shardings
(also across the processes of a ``jax.distributed`` job). Needs the ``checkpoint`` extra
(``pip install 'jaxwise[checkpoint]'``, orbax-checkpoint).

Examples:
    >>> import tempfile, jax.numpy as jnp
    >>> from jaxwise import optim
    >>> from jaxwise.checkpoint import restore, save
    >>> from jaxwise.train import TrainState
    >>> state = TrainState.create({"w": jnp.ones(2)}, optim.sgd(0.1), 0)
    >>> directory = tempfile.mkdtemp()
    >>> _ = save(directory, state, {"epoch": 0})
    >>> restore(directory, like=state).params["w"].tolist()
    [1.0, 1.0]
"""

from jaxwise.checkpoint._checkpoint import (
    Checkpointer,
    CheckpointWarning,
    data_fingerprint,
    latest_step,
    load_metadata,
    restore,
    save,
)
from jaxwise.checkpoint._format import CheckpointError

__all__ = [
    "CheckpointError",
    "CheckpointWarning",
    "Checkpointer",
    "data_fingerprint",
    "latest_step",
    "load_metadata",
    "restore",
    "save",
]

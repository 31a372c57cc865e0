"""Training: a frozen-dataclass state, donation-safe jitted steps and epochs, a streaming loop.

Checkpoints live in `jaxwise.checkpoint`, meshes and placement in `jaxwise.sharding`.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxwise import optim
    >>> from jaxwise.train import TrainState, make_train_epoch
    >>> def loss(params, batch):
    ...     x, y = batch
    ...     return jnp.mean((x @ params["w"] - y) ** 2)
    >>> x = jax.random.normal(jax.random.key(1), (64, 3)); y = x @ jnp.asarray([1.0, -2.0, 0.5])
    >>> tx = optim.adam(0.1)
    >>> state = TrainState.create({"w": jnp.zeros(3)}, tx, jax.random.key(0))
    >>> epoch = make_train_epoch(loss, tx, batch_size=16)
    >>> for _ in range(30):
    ...     state, metrics = epoch(state, (x, y))
    >>> bool(metrics["loss"][-1] < 1e-2)
    True
"""

from jaxwise.train._donation import DonationError, check_donatable, check_optimizer_fits
from jaxwise.train._epoch import Sampler, ShuffleSampler, TrainEpoch, make_train_epoch
from jaxwise.train._loop import FitReport, StatefulIterator, Terminated, fit
from jaxwise.train._precision import DynamicLossScale, LossScaleState
from jaxwise.train._state import TrainState, type_signature
from jaxwise.train._step import TrainStep, make_train_step
from jaxwise.train._update import Gradients

__all__ = [
    "DonationError",
    "DynamicLossScale",
    "FitReport",
    "Gradients",
    "LossScaleState",
    "Sampler",
    "ShuffleSampler",
    "StatefulIterator",
    "Terminated",
    "TrainEpoch",
    "TrainState",
    "TrainStep",
    "check_donatable",
    "check_optimizer_fits",
    "fit",
    "make_train_epoch",
    "make_train_step",
    "type_signature",
]

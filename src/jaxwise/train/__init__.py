"""Training as composition: a gradient function × a sampler → a jitted, donating program.

A [`GradientFn`][jaxwise.train.GradientFn] says how a batch becomes a gradient
([`value_and_grad`][jaxwise.train.value_and_grad] of a loss,
[`mixed_precision`][jaxwise.train.mixed_precision], DP-SGD's
[`dp_gradient_fn`][jaxwise.privacy.dp_gradient_fn], or one written by hand); a
[`Sampler`][jaxwise.train.Sampler] how an epoch draws its batches;
[`make_step`][jaxwise.train.make_step] and [`make_epoch`][jaxwise.train.make_epoch] make the
program (NaN guard, donation audit, meshes). The optimizer lives in the
[`TrainState`][jaxwise.train.TrainState] (``state.tx``). Checkpoints live in
`jaxwise.checkpoint`, meshes and placement in `jaxwise.sharding`.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> from jaxwise import optim
    >>> from jaxwise.train import ShuffleSampler, TrainState, make_epoch, value_and_grad
    >>> def loss(params, batch):
    ...     x, y = batch
    ...     return jnp.mean((x @ params["w"] - y) ** 2)
    >>> x = jax.random.normal(jax.random.key(1), (64, 3)); y = x @ jnp.asarray([1.0, -2.0, 0.5])
    >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.adam(0.1), jax.random.key(0))
    >>> epoch = make_epoch(value_and_grad(loss), ShuffleSampler(16))
    >>> for _ in range(30):
    ...     state, metrics = epoch(state, (x, y))
    >>> bool(metrics["loss"][-1] < 1e-2)
    True
"""

from jaxwise.train._loop._fit import (
    Callback,
    Checkpointing,
    EarlyStopping,
    FitReport,
    FitRun,
    LambdaCallback,
    MetricLogging,
    ProgressBar,
    Resume,
    ResumeError,
    ResumeWarning,
    StatefulIterator,
    Terminated,
    fit,
)
from jaxwise.train._program._donation import DonationError, check_donatable, check_optimizer_fits
from jaxwise.train._program._epoch import TrainEpoch, make_epoch, make_train_epoch
from jaxwise.train._program._gradient import (
    GradientFn,
    Gradients,
    MixedPrecision,
    PrivacyClaim,
    Requirements,
    StepContext,
    ValueAndGrad,
    mixed_precision,
    value_and_grad,
)
from jaxwise.train._program._precision import DynamicLossScale, LossScaleState
from jaxwise.train._program._sampler import CyclicPoissonSampler, PoissonSampler, ShuffleSampler
from jaxwise.train._program._sampling import Sampler, SamplingFacts
from jaxwise.train._program._state import TrainState, type_signature
from jaxwise.train._program._step import TrainStep, make_step, make_train_step

__all__ = [
    "Callback",
    "Checkpointing",
    "CyclicPoissonSampler",
    "DonationError",
    "DynamicLossScale",
    "EarlyStopping",
    "FitReport",
    "FitRun",
    "GradientFn",
    "Gradients",
    "LambdaCallback",
    "LossScaleState",
    "MetricLogging",
    "MixedPrecision",
    "PrivacyClaim",
    "PoissonSampler",
    "ProgressBar",
    "Requirements",
    "Resume",
    "ResumeError",
    "ResumeWarning",
    "Sampler",
    "SamplingFacts",
    "ShuffleSampler",
    "StatefulIterator",
    "StepContext",
    "Terminated",
    "TrainEpoch",
    "TrainState",
    "TrainStep",
    "ValueAndGrad",
    "check_donatable",
    "check_optimizer_fits",
    "fit",
    "make_epoch",
    "make_step",
    "make_train_epoch",
    "make_train_step",
    "mixed_precision",
    "type_signature",
    "value_and_grad",
]

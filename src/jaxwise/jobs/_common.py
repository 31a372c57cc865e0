"""Pieces shared by every CLI job: option checks, the optimizer, evaluation, the float64 referee.

Nothing here prints: jobs return JSON-ready summaries and raise :class:`UserError` (exit 2,
one line) for problems with the user's input, or :class:`RunFailed` (exit 1, one line) when
a run produced no usable model.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import sys
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import numerics, optim
from jaxwise._checks import UserError
from jaxwise._cli_options import (
    check_hidden,
    check_training_options,
    option_float,
    option_int,
    parameter_count,
)
from jaxwise._progress import progress_bar
from jaxwise.models import mlp_apply
from jaxwise.tree import mask_by_path

DELTA = 1e-5


class RunFailed(Exception):
    """A run finished without a usable model (non-finite loss, every step skipped): exit code 1."""

    __module__ = "jaxwise.jobs"

    exit_code = 1


# --------------------------------------------------------------------------
# Model, optimizer, evaluation
# --------------------------------------------------------------------------


def xent_single(logits: jax.Array, label: jax.Array) -> jax.Array:
    """Cross-entropy of one example's logits ``(C,)`` against an integer label."""
    return -numerics.log_softmax(logits)[label]


def _example_loss(params: Any, example: tuple[jax.Array, jax.Array]) -> jax.Array:
    x, y = example
    return xent_single(mlp_apply(params, x), y)


def per_example_loss() -> Callable[[Any, tuple[jax.Array, jax.Array]], jax.Array]:
    """``loss(params, (x, y))`` of ONE example: the MLP's cross-entropy."""
    return _example_loss


def batch_loss(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Mean cross-entropy of the MLP on a mini-batch ``(x, y)``."""
    return numerics.cross_entropy(mlp_apply(params, batch[0]), batch[1])


def make_optimizer(
    total_steps: int, peak_lr: float, weight_decay: float, warmup: int, end_lr: float
) -> Any:
    """``chain(clip 1.0, Adam, decoupled decay on weights only, warmup-cosine learning rate)``."""
    warmup = max(0, min(warmup, total_steps - 1))
    schedule = optim.warmup_cosine_decay_schedule(
        0.0, peak_lr, warmup, max(total_steps, warmup + 1), end_lr
    )
    return optim.chain(
        optim.clip_by_global_norm(1.0),
        optim.scale_by_adam(),
        optim.add_decayed_weights(weight_decay, mask=lambda p: mask_by_path(p, r"\.w$")),
        optim.scale_by_learning_rate(schedule),
    ), schedule


@jax.jit
def evaluate(params: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(mean cross-entropy, accuracy) of the MLP on ``(x, y)``."""
    logits = mlp_apply(params, x)
    return numerics.cross_entropy(logits, y), jnp.mean(
        (jnp.argmax(logits, -1) == y).astype(jnp.float32)
    )


@jax.jit
def _probabilities(params: Any, x: jax.Array) -> jax.Array:
    return jax.nn.softmax(mlp_apply(params, x), axis=-1)


def predict_proba(params: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``x (N, D) -> probabilities (N, C)`` as NumPy, for plots and reports."""
    return lambda x: np.asarray(_probabilities(params, jnp.asarray(x, jnp.float32)))


def accuracy(params: Any, x: np.ndarray, y: np.ndarray) -> float:
    return float(evaluate(params, jnp.asarray(x), jnp.asarray(y))[1])


def mlp_float64(params: Any, x: np.ndarray) -> np.ndarray:
    """The MLP's logits recomputed independently in NumPy float64 (the referee)."""
    h = np.asarray(x, np.float64)
    n = len(params)
    for i in range(n):
        w = np.asarray(params[f"dense_{i}"]["w"], np.float64)
        b = np.asarray(params[f"dense_{i}"]["b"], np.float64)
        h = h @ w + b
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return h


def float64_check(params: Any, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    """Logits, cross-entropy and accuracy of the float32 model against the float64 referee."""
    ours = np.asarray(jax.jit(mlp_apply)(params, jnp.asarray(x)), np.float64)
    ref = mlp_float64(params, x)
    shifted = ref - ref.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    ce64 = float(-logp[np.arange(len(y)), y].mean())
    ce32 = float(evaluate(params, jnp.asarray(x), jnp.asarray(y))[0])
    return {
        "max_logit_error": float(np.max(np.abs(ours - ref))),
        "cross_entropy_float64": ce64,
        "cross_entropy_error": abs(ce32 - ce64),
        "accuracy_float64": float((ref.argmax(1) == y).mean()),
        "accuracy_float32": float((ours.argmax(1) == y).mean()),
    }


@functools.partial(jax.jit, static_argnums=(0, 1))
def schedule_values(schedule: Callable[[jax.Array], jax.Array], steps: int) -> jax.Array:
    """The learning rate at every step, for plots and metrics (one compiled program)."""
    return jax.vmap(schedule)(jnp.arange(steps))


def make_epoch(tx: Any, cfg: Any) -> Callable[..., Any]:
    """The compiled epoch: plain (shuffled batches) or DP-SGD (Poisson sampling, ghost clipping)."""
    from jaxwise.privacy import make_dp_train_epoch
    from jaxwise.train import make_train_epoch

    if cfg.dp:
        return make_dp_train_epoch(
            per_example_loss(),
            tx,
            batch_size=cfg.batch_size,
            clip_norm=cfg.clip_norm,
            noise_multiplier=cfg.noise_multiplier,
            sampler="poisson",
            method="ghost",
        )
    return make_train_epoch(batch_loss, tx, cfg.batch_size)


def steps_per_epoch(n_train: int, cfg: Any) -> int:
    """Steps per epoch of :func:`make_epoch`'s sampler (shuffled batches, or Poisson samples)."""
    from jaxwise.privacy import PoissonSampler
    from jaxwise.train import ShuffleSampler

    sampler = PoissonSampler(cfg.batch_size) if cfg.dp else ShuffleSampler(cfg.batch_size)
    return sampler.steps(n_train)


def dp_report(cfg: Any, n_train: int, steps: int) -> dict[str, Any]:
    """ε at δ = 1e-5 from dp-accounting for the Poisson-sampled run, with its parameters."""
    from jaxwise.privacy import epsilon

    q = cfg.batch_size / n_train
    eps = (
        epsilon(noise_multiplier=cfg.noise_multiplier, sample_rate=q, steps=steps, delta=DELTA)
        if cfg.noise_multiplier and steps
        else math.inf
    )
    return {
        "epsilon": eps,
        "delta": DELTA,
        "noise_multiplier": cfg.noise_multiplier,
        "clip_norm": cfg.clip_norm,
        "sample_rate": q,
        "steps": steps,
        "sampling": "poisson",
    }


@contextlib.contextmanager
def checkpoint_warnings_as_lines() -> Iterator[None]:
    """Each `CheckpointWarning` of the block as one ``jaxwise: warning: …`` line on stderr."""
    from jaxwise.checkpoint import CheckpointWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        yield
    for warning in caught:
        if issubclass(warning.category, CheckpointWarning):
            print(f"jaxwise: warning: {warning.message}", file=sys.stderr)
        else:  # anything else is not ours to swallow
            warnings.warn(warning.message, warning.category, stacklevel=3)


def restore_reporting(path: Path, like: Any, run_id: str | None) -> tuple[Any, dict[str, Any]]:
    """``(state, metadata)`` of the run's newest usable step; skipped steps said in one line."""
    from jaxwise.checkpoint import restore

    with checkpoint_warnings_as_lines():
        return restore(path, like=like, with_metadata=True, run_id=run_id)


def save_reporting(path: Path, state: Any, metadata: dict[str, Any], run_id: str | None) -> None:
    """Save a step of the run; a dead writer's lock taken over is said in one line."""
    from jaxwise.checkpoint import save

    with checkpoint_warnings_as_lines():
        save(path, state, metadata, run_id=run_id)


def params_digest(params: Any) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()[:16]


def step_metrics(metrics: dict[str, Any], n_steps: int) -> tuple[np.ndarray | None, int]:
    """(per-step losses or None, number of skipped steps) from an epoch's stacked metrics."""
    losses = np.asarray(metrics["loss"], np.float64) if "loss" in metrics else None
    skipped = int(np.asarray(metrics["skipped"]).sum()) if "skipped" in metrics else 0
    return losses, min(skipped, n_steps)


def check_run_health(final_loss: float | None, skipped: int, steps: int, what: str) -> None:
    """:class:`RunFailed` when a run cannot have produced a usable model."""
    if steps and skipped >= steps:
        raise RunFailed(
            f"{what}: every one of the {steps} training steps was skipped as non-finite "
            "(the model never trained); lower --lr or check the data"
        )
    if final_loss is not None and not math.isfinite(final_loss):
        raise RunFailed(
            f"{what}: the final training loss is {final_loss} ({skipped} of {steps} steps skipped "
            "as non-finite); lower --lr or check the data"
        )


def jsonable(value: Any) -> Any:
    """A strict-JSON copy of ``value``: NumPy scalars and arrays to Python, NaN/±inf to ``None``."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


def progress(
    enabled: bool, total: int, description: str, completed: int = 0
) -> AbstractContextManager[Callable[..., None]]:
    """The jobs' progress bar on stderr (loss and accuracy); yields ``advance(loss=, acc=)``."""
    return progress_bar(
        enabled,
        total,
        description,
        "loss {loss:.4f}  acc {acc:.3f}",
        feature="the progress bar",
        completed=completed,
        loss=math.nan,
        acc=math.nan,
    )


__all__ = [
    "DELTA",
    "RunFailed",
    "UserError",
    "accuracy",
    "batch_loss",
    "check_hidden",
    "check_run_health",
    "check_training_options",
    "dp_report",
    "evaluate",
    "float64_check",
    "jsonable",
    "make_epoch",
    "make_optimizer",
    "mlp_float64",
    "option_float",
    "option_int",
    "parameter_count",
    "params_digest",
    "per_example_loss",
    "predict_proba",
    "progress",
    "restore_reporting",
    "save_reporting",
    "schedule_values",
    "step_metrics",
    "steps_per_epoch",
    "xent_single",
]

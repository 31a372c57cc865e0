"""Pieces shared by every CLI job: option checks, the optimizer, evaluation, the float64 referee.

Nothing here prints: jobs return JSON-ready summaries and raise `UserError` (exit 2,
one line) for problems with the user's input, or `RunFailed` (exit 1, one line) when
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
import optax

from jaxwise import numerics, optim
from jaxwise._errors import JaxwiseError
from jaxwise._shared._checks import UserError
from jaxwise._shared._progress import progress_bar
from jaxwise.cli._jobs import _dp
from jaxwise.cli._options import (
    check_hidden,
    check_training_options,
    option_float,
    option_int,
    parameter_count,
)
from jaxwise.models import mlp_apply
from jaxwise.tree import mask_by_path

DELTA = _dp.DELTA


class RunFailed(JaxwiseError):
    """A run finished without a usable model (non-finite loss, every step skipped): exit code 1."""

    __module__ = "jaxwise.cli._jobs"

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


_canary_losses = jax.jit(jax.vmap(_example_loss, in_axes=(None, 0)))


def per_example_loss() -> Callable[[Any, tuple[jax.Array, jax.Array]], jax.Array]:
    """``loss(params, (x, y))`` of ONE example: the MLP's cross-entropy."""
    return _example_loss


def batch_loss(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Mean cross-entropy of the MLP on a mini-batch ``(x, y)``."""
    return numerics.cross_entropy(mlp_apply(params, batch[0]), batch[1])


def batch_loss_and_accuracy(
    params: Any, batch: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array]:
    """``(mean cross-entropy, accuracy)`` of the MLP on a mini-batch ``(x, y)`` (``has_aux``)."""
    logits = mlp_apply(params, batch[0])
    correct = (jnp.argmax(logits, -1) == batch[1]).astype(jnp.float32)
    return numerics.cross_entropy(logits, batch[1]), jnp.mean(correct)


def make_optimizer(
    total_steps: int, peak_lr: float, weight_decay: float, warmup: int, end_lr: float
) -> tuple[optax.GradientTransformationExtraArgs, optax.Schedule]:
    """``chain(clip 1.0, Adam, decoupled decay on weights only, warmup-cosine learning rate)``.

    Args:
        total_steps: the steps of the whole run.
        peak_lr: the learning rate after the warm-up.
        weight_decay: the decay of the weights (``.w`` leaves; biases are not decayed).
        warmup: warm-up steps (clamped to ``total_steps - 1``).
        end_lr: the learning rate at the end of the cosine decay.

    Returns:
        ``(optimizer, schedule)``: the optimizer and its learning-rate schedule.
    """
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
def evaluate_splits(
    params: Any, train: tuple[jax.Array, jax.Array], val: tuple[jax.Array, jax.Array]
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """(loss, accuracy) on the training rows, then on the validation rows: ONE program."""
    return (*evaluate(params, *train), *evaluate(params, *val))


@jax.jit
def _probabilities(params: Any, x: jax.Array) -> jax.Array:
    return jax.nn.softmax(mlp_apply(params, x), axis=-1)


def predict_proba(params: Any) -> Callable[[np.ndarray], np.ndarray]:
    """``x (N, D) -> probabilities (N, C)`` as NumPy, for plots and reports."""
    return lambda x: np.asarray(_probabilities(params, to_device(np.asarray(x, np.float32))))


@jax.jit
def predict_classes(params: Any, x: jax.Array) -> jax.Array:
    """The MLP's predicted class of each row of ``x (N, D)``: int32 ``(N,)``."""
    return jnp.argmax(mlp_apply(params, x), -1).astype(jnp.int32)


def to_device(*arrays: np.ndarray) -> Any:
    """Host arrays onto the default device (``jax.device_put``: no program compiled for it).

    One array in, one out; several in, a tuple out.
    """
    placed = tuple(jax.device_put(a) for a in arrays)
    return placed[0] if len(placed) == 1 else placed


def initial_state(tx: Any, sizes: tuple[int, ...], seed: int, gradient: Any = None) -> Any:
    """The initial state: keys, He-initialised MLP, optimizer state (one program under ``jit``).

    ``gradient``: the run's gradient (`run_gradient`), whose state (correlated noise, an
    adaptive clip) the `TrainState` holds from the start; ``None`` for a plain run.
    """
    from jaxwise.models import init_mlp
    from jaxwise.train import TrainState

    init_key, state_key = jax.random.split(jax.random.key(seed))
    return TrainState.create(init_mlp(init_key, sizes), tx, state_key, gradient=gradient)


def run_gradient(cfg: Any, n_train: int) -> Any:
    """The run's DP gradient (`_dp.dp_gradient`, built once), or ``None`` for a plain run."""
    return _dp.dp_gradient(cfg, n_train, per_example_loss()) if cfg.dp else None


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


_U32 = 2.0**-24  # float32's unit roundoff (the accumulation of every matmul)

# The unit roundoff of a matrix product's float32 operands at each `jax.default_matmul_precision`
# value: one bfloat16 pass keeps 8 significant bits, TensorFloat-32 11, three bfloat16 passes
# (the split a = hi + lo) about 16 (15 stated, conservatively), "highest" all of float32's 24.
_OPERAND_ROUNDOFF = {
    "bfloat16": 2.0**-8,
    "tensorfloat32": 2.0**-11,
    "bfloat16_3x": 2.0**-15,
    "float32": _U32,
}
_PRECISION_ALIASES = {"fastest": "bfloat16", "high": "bfloat16_3x", "highest": "float32"}
# "default" is the backend's own choice: a TPU multiplies float32 in one bfloat16 pass.
_BACKEND_DEFAULT = {"tpu": "bfloat16"}


def matmul_precision_name(precision: str | None, backend: str | None = None) -> str:
    """The float32 matmul precision that ``precision`` means on ``backend`` (``"float32"``, …).

    Args:
        precision: a `jax.default_matmul_precision` value (``"highest"``, ``"bfloat16"``, …)
            or ``None``/``"default"`` (the backend's default).
        backend: the platform (``"cpu"``, ``"tpu"``, ``"gpu"``); ``None``: the default backend.

    Returns:
        One of ``"bfloat16"``, ``"tensorfloat32"``, ``"bfloat16_3x"``, ``"float32"``.

    Raises:
        ValueError: ``precision`` is not a known precision.

    Examples:
        >>> matmul_precision_name("highest"), matmul_precision_name(None, "tpu")
        ('float32', 'bfloat16')
    """
    name = "default" if precision is None else str(precision).lower()
    if name == "default":
        backend = jax.default_backend() if backend is None else backend
        return _BACKEND_DEFAULT.get(backend, "float32")
    name = _PRECISION_ALIASES.get(name, name)
    if name not in _OPERAND_ROUNDOFF:
        raise ValueError(f"`precision` must be a JAX matmul precision, got {precision!r}")
    return name


def mlp_logit_error_bound(params: Any, x: np.ndarray, precision: str) -> np.ndarray:
    """An a-priori bound ``(N, C)`` on |float32 logits − exact logits| of the MLP (in float64).

    The standard rounding-error model of a dense layer ``h @ w + b`` whose operands are rounded
    to the unit roundoff ``u`` of ``precision`` and whose ``k`` products and bias are summed in
    float32: ``|err(y)| <= e @ |w| + (2u + u² + (k + 2) u32) (|ĥ| @ |w| + |b|)`` with ``e``
    the input's error bound and ``|ĥ| = |h| + e``; ReLU does not increase an error.

    Args:
        params: the MLP's parameters (``dense_0`` …).
        x: ``(N, d)`` inputs (exact: float32 data).
        precision: a name from `matmul_precision_name`.

    Returns:
        ``(N, C)`` elementwise bounds, float64.
    """
    u = _OPERAND_ROUNDOFF[precision]
    h = np.asarray(x, np.float64)
    err = np.zeros_like(h)
    n = len(params)
    for i in range(n):
        w = np.asarray(params[f"dense_{i}"]["w"], np.float64)
        b = np.asarray(params[f"dense_{i}"]["b"], np.float64)
        rel = 2 * u + u * u + (w.shape[0] + 2) * _U32
        err = err @ np.abs(w) + rel * ((np.abs(h) + err) @ np.abs(w) + np.abs(b))
        h = h @ w + b
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return err


def float64_check(
    params: Any,
    x: np.ndarray,
    y: np.ndarray,
    logits: np.ndarray,
    cross_entropy: float,
    precision: str = "float32",
) -> dict[str, Any]:
    """The float32 model's ``logits (N, C)`` and mean cross-entropy against the float64 referee.

    The referee is NumPy float64 on the host (never float64 on an accelerator). ``precision``
    (a name from `matmul_precision_name`) is the precision the logits' matrix products ran
    at, and the limits follow from it. At ``"float32"`` (``"highest"``): every logit within
    ``1e-4``, the cross-entropy within ``1e-4``, the accuracies at most one example apart.
    At a lower precision (a TPU's one-pass bfloat16 default): every logit within its a-priori
    bound (`mlp_logit_error_bound`), the cross-entropy within ``1e-4`` plus twice the mean
    of the rows' largest bounds, and a prediction different from the float64 one only where
    the float64 top-2 margin is within twice the row's bound.

    Returns:
        The errors, their limits (``logit_limit``, ``cross_entropy_limit``) and verdicts
        (``logits_ok``, ``cross_entropy_ok``, ``accuracy_ok``), ``precision``, the float64
        cross-entropy and both accuracies.
    """
    ours = np.asarray(logits, np.float64)
    ref = mlp_float64(params, x)
    shifted = ref - ref.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    ce64 = float(-logp[np.arange(len(y)), y].mean())
    error = np.abs(ours - ref)
    flips = ours.argmax(1) != ref.argmax(1)
    ce_error = abs(cross_entropy - ce64)
    if precision == "float32":
        logit_limit = ce_limit = 1e-4
        logits_ok = bool(error.max() < logit_limit)
        accuracy_ok = bool(np.sum(ours.argmax(1) == y) - np.sum(ref.argmax(1) == y) in (-1, 0, 1))
    else:
        bound = mlp_logit_error_bound(params, x, precision)
        row_bound = bound.max(1)
        top2 = np.sort(ref, axis=1)[:, -2:]
        logit_limit, ce_limit = float(row_bound.max()), 1e-4 + 2 * float(row_bound.mean())
        logits_ok = bool(np.all(error <= bound))
        accuracy_ok = bool(np.all((top2[:, 1] - top2[:, 0])[flips] <= 2 * row_bound[flips]))
    return {
        "precision": precision,
        "max_logit_error": float(error.max()),
        "logit_limit": logit_limit,
        "logits_ok": logits_ok,
        "cross_entropy_float64": ce64,
        "cross_entropy_error": ce_error,
        "cross_entropy_limit": ce_limit,
        "cross_entropy_ok": bool(ce_error < ce_limit),
        "accuracy_float64": float((ref.argmax(1) == y).mean()),
        "accuracy_float32": float((ours.argmax(1) == y).mean()),
        "predictions_differing": int(flips.sum()),
        "accuracy_ok": accuracy_ok,
    }


@functools.partial(jax.jit, static_argnums=(0, 1))
def schedule_values(schedule: Callable[[jax.Array], jax.Array], steps: int) -> jax.Array:
    """The learning rate at every step, for plots and metrics (one compiled program)."""
    return jax.vmap(schedule)(jnp.arange(steps))


def build_epoch(cfg: Any, *, accuracy: bool = False, n_train: int | None = None) -> Any:
    """The compiled epoch: plain (shuffled batches) or DP (ghost clipping, `_dp.dp_plan`).

    A DP epoch over ``n_train`` examples: the ``--mechanism``'s noise with the sampler its
    accounting needs (Poisson; cyclic Poisson for BandMF/BLT), the fixed or adaptive clip.
    With ``accuracy``, the plain epoch's metrics include ``"aux"``: each step's mini-batch
    accuracy (see `epoch_progress`).
    """
    from jaxwise.train import make_train_epoch

    if cfg.dp:
        from jaxwise.train import make_epoch

        assert n_train is not None, "a DP epoch needs the number of training examples"
        plan = _dp.dp_plan(cfg, n_train)
        return make_epoch(run_gradient(cfg, n_train), plan.sampler)
    if accuracy:
        return make_train_epoch(batch_loss_and_accuracy, cfg.batch_size, has_aux=True)
    return make_train_epoch(batch_loss, cfg.batch_size)


def epoch_progress(metrics: dict[str, Any], step_losses: np.ndarray) -> dict[str, float]:
    """Progress-bar fields from an epoch's own metrics: mean mini-batch loss (and accuracy)."""
    fields = {"loss": float(np.mean(step_losses))}
    if "aux" in metrics:
        fields["acc"] = float(np.mean(np.asarray(metrics["aux"])))
    return fields


def steps_per_epoch(n_train: int, cfg: Any) -> int:
    """Steps per epoch of `build_epoch`'s sampler (shuffled batches, or Poisson samples)."""
    if cfg.dp:
        from jaxwise.privacy import PoissonSampler

        return PoissonSampler(cfg.batch_size).steps(n_train)
    from jaxwise.train import ShuffleSampler

    return ShuffleSampler(cfg.batch_size).steps(n_train)


def dp_report(cfg: Any, n_train: int, steps: int) -> dict[str, Any]:
    """ε at δ = 1e-5 from dp-accounting for the run, its mechanism and parameters."""
    return _dp.dp_summary(cfg, n_train, steps)


def check_dp_options(cfg: Any) -> None:
    """``--mechanism``, ``--bands``, ``--adaptive-clip``: only with ``--dp``, in range."""
    _dp.check_dp_options(cfg)


def check_audit_option(cfg: Any) -> None:
    """``--audit M``: M >= 6 canaries (fewer cannot bound ε above 0 at 95% confidence, even
    with every guess right), only with ``--dp``."""
    if cfg.audit is None:
        return
    option_int(cfg.audit, "--audit", min_value=6, max_value=100_000)
    if not cfg.dp:
        raise UserError("--audit audits a DP-SGD run: it needs --dp")


def audit_canaries_for(cfg: Any, x: np.ndarray, y: np.ndarray, classes: int) -> Any:
    """``--audit M``: M feature canaries (one input feature each), included with probability ½."""
    from jaxwise.privacy import audit_canaries

    return audit_canaries((x, y), cfg.audit, seed=cfg.seed, num_classes=classes)


def audit_run(params: Any, canaries: Any, n_features: int) -> tuple[dict[str, Any], Any]:
    """The audit of a run with canaries, and the model without its canary features.

    Every canary is scored by minus its loss; ``empirical_epsilon`` turns the guesses on
    the most confident ones into an ε lower bound at δ = ``DELTA``. The first layer's rows
    of the canary features (never used by a real input) are then dropped: the model on
    real inputs is unchanged.
    """
    from jaxwise.privacy import empirical_epsilon

    cx, cy = (jnp.asarray(a) for a in canaries.examples)
    losses = _canary_losses(params, (cx, cy))
    scores = -np.asarray(losses, np.float64)
    bound = empirical_epsilon(
        np.nan_to_num(scores, nan=-1e30, neginf=-1e30), canaries.included, delta=DELTA
    )
    first = {**params["dense_0"], "w": params["dense_0"]["w"][:n_features]}
    audit = {
        "epsilon_audit_lower_bound": bound,
        "canaries": canaries.m,
        "canaries_included": int(canaries.included.sum()),
        "confidence": 0.95,
    }
    return audit, {**params, "dense_0": first}


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
    from jaxwise.checkpoint import load_metadata, restore

    with checkpoint_warnings_as_lines():
        state = restore(path, like=like, run_id=run_id)
    return state, load_metadata(path, step=int(state.step), run_id=run_id)


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
    """`RunFailed` when a run cannot have produced a usable model."""
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
    "batch_loss",
    "batch_loss_and_accuracy",
    "check_hidden",
    "check_run_health",
    "check_training_options",
    "audit_canaries_for",
    "check_audit_option",
    "check_dp_options",
    "audit_run",
    "dp_report",
    "epoch_progress",
    "evaluate",
    "evaluate_splits",
    "initial_state",
    "run_gradient",
    "float64_check",
    "matmul_precision_name",
    "mlp_logit_error_bound",
    "jsonable",
    "build_epoch",
    "make_optimizer",
    "mlp_float64",
    "option_float",
    "option_int",
    "parameter_count",
    "params_digest",
    "per_example_loss",
    "predict_classes",
    "predict_proba",
    "progress",
    "restore_reporting",
    "save_reporting",
    "schedule_values",
    "step_metrics",
    "steps_per_epoch",
    "to_device",
    "xent_single",
]

"""The CLI's jobs as functions: the spiral demo, training on a CSV, finding label errors.

Each job returns a JSON-serialisable summary dict; :mod:`jaxwise.cli` parses
arguments and prints. Problems with the user's input raise
:class:`UserError` (one line; the CLI exits with code 2) *before* anything is
written, and nothing already on disk (checkpoints, outputs) is overwritten
or deleted.

Example:
    >>> summary = run_spiral(SpiralConfig(epochs=2, n_per_class=60, out=None, progress=False))
    >>> summary["compiles"], 0.0 <= summary["test_accuracy"] <= 1.0
    (1, True)
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import data, numerics, optim
from jaxwise.compilation import CompileBudget, CompileCounter
from jaxwise.models import init_mlp, mlp_apply
from jaxwise.per_example import hardest_examples, mlp_loss, per_example_grad_norms
from jaxwise.privacy import epsilon, make_dp_train_epoch
from jaxwise.train import TrainState, latest_step, load_metadata, make_train_epoch, restore, save
from jaxwise.tree import mask_by_path, param_table

__all__ = [
    "SpiralConfig",
    "TabularConfig",
    "UserError",
    "run_label_errors",
    "run_spiral",
    "run_train",
]

DELTA = 1e-5


class UserError(Exception):
    """A problem with the user's input or environment: reported in one line, exit code 2."""


# --------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------


def _xent_single(logits: jax.Array, label: jax.Array) -> jax.Array:
    return -numerics.log_softmax(logits)[label]


PER_EXAMPLE_LOSS = mlp_loss(_xent_single)


def _loss(params: Any, batch: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Mean cross-entropy of the MLP on a mini-batch ``(x, y)``."""
    return numerics.cross_entropy(mlp_apply(params, batch[0]), batch[1])


def make_optimizer(total_steps: int, peak_lr: float, weight_decay: float, warmup: int, end_lr: float) -> Any:
    """``chain(clip 1.0, Adam, decoupled decay on weights only, warmup-cosine learning rate)``."""
    warmup = max(0, min(warmup, total_steps - 1))
    schedule = optim.warmup_cosine_decay_schedule(0.0, peak_lr, warmup, max(total_steps, warmup + 1), end_lr)
    return optim.chain(
        optim.clip_by_global_norm(1.0),
        optim.scale_by_adam(),
        optim.add_decayed_weights(weight_decay, mask=lambda p: mask_by_path(p, r"\.w$")),
        optim.scale_by_learning_rate(schedule),
    ), schedule


def _check_out(out: Path | None) -> None:
    """Fail early (UserError) if ``out`` cannot be created or written."""
    if out is None:
        return
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".jaxwise-write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as err:
        raise UserError(f"--out {out}: not writable ({err.strerror or err})") from err


def _predict_proba(params: Any) -> Callable[[np.ndarray], np.ndarray]:
    fn = jax.jit(lambda p, x: jax.nn.softmax(mlp_apply(p, x), axis=-1))
    return lambda x: np.asarray(fn(params, jnp.asarray(x, jnp.float32)))


def _mlp_float64(params: Any, x: np.ndarray) -> np.ndarray:
    """The MLP's logits recomputed independently in NumPy float64."""
    h = np.asarray(x, np.float64)
    n = len(params)
    for i in range(n):
        w = np.asarray(params[f"dense_{i}"]["w"], np.float64)
        b = np.asarray(params[f"dense_{i}"]["b"], np.float64)
        h = h @ w + b
        if i < n - 1:
            h = np.maximum(h, 0.0)
    return h


def _float64_check(params: Any, x: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    ours = np.asarray(jax.jit(mlp_apply)(params, jnp.asarray(x)), np.float64)
    ref = _mlp_float64(params, x)
    shifted = ref - ref.max(1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    ce64 = float(-logp[np.arange(len(y)), y].mean())
    ce32 = float(_evaluate(params, jnp.asarray(x), jnp.asarray(y))[0])
    return {
        "max_logit_error": float(np.max(np.abs(ours - ref))),
        "cross_entropy_float64": ce64,
        "cross_entropy_error": abs(ce32 - ce64),
        "accuracy_float64": float((ref.argmax(1) == y).mean()),
        "accuracy_float32": float((ours.argmax(1) == y).mean()),
    }


@jax.jit
def _evaluate(params: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(mean cross-entropy, accuracy) of the MLP on ``(x, y)``."""
    logits = mlp_apply(params, x)
    return numerics.cross_entropy(logits, y), jnp.mean((jnp.argmax(logits, -1) == y).astype(jnp.float32))


def _accuracy(params: Any, x: np.ndarray, y: np.ndarray) -> float:
    return float(_evaluate(params, jnp.asarray(x), jnp.asarray(y))[1])


@contextmanager
def _progress(enabled: bool, total: int, description: str, completed: int = 0) -> Iterator[Callable[..., None]]:
    """A rich progress bar on stderr; yields ``advance(**fields)``."""
    if not enabled:
        yield lambda **_: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.4f}  acc {task.fields[acc]:.3f}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=False) as bar:
        task = bar.add_task(description, total=total, completed=completed, loss=float("nan"), acc=float("nan"))
        yield lambda **fields: bar.update(task, advance=1, **fields)


def _check_training_options(cfg: Any) -> None:
    """Checks shared by every training job's configuration."""
    if cfg.epochs < 1:
        raise UserError(f"--epochs must be >= 1, got {cfg.epochs}")
    if cfg.batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {cfg.batch_size}")
    if cfg.dp and (cfg.clip_norm <= 0 or cfg.noise_multiplier < 0):
        raise UserError("--clip-norm must be > 0 and --noise-multiplier >= 0")


def _make_epoch(tx: Any, cfg: Any) -> tuple[Callable[..., Any], str]:
    """The compiled epoch (plain, or DP-SGD with Poisson sampling and ghost clipping) and its jit name."""
    if cfg.dp:
        return make_dp_train_epoch(PER_EXAMPLE_LOSS, tx, batch_size=cfg.batch_size, clip_norm=cfg.clip_norm,
                                   noise_multiplier=cfg.noise_multiplier, sampling="poisson", method="ghost"), "epoch"
    return make_train_epoch(_loss, tx, cfg.batch_size), "train_epoch"


def _dp_report(cfg: Any, n_train: int, steps: int) -> dict[str, Any]:
    """ε at δ = 1e-5 from dp-accounting for the Poisson-sampled run, with its parameters."""
    q = cfg.batch_size / n_train
    eps = epsilon(cfg.noise_multiplier, q, steps, DELTA) if cfg.noise_multiplier and steps else float("inf")
    return {"epsilon": eps, "delta": DELTA, "noise_multiplier": cfg.noise_multiplier, "clip_norm": cfg.clip_norm,
            "sample_rate": q, "steps": steps, "sampling": "poisson"}


def _params_digest(params: Any) -> str:
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves(params):
        digest.update(np.asarray(leaf).tobytes())
    return digest.hexdigest()[:16]


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating, float)):
        return float(value)
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if isinstance(value, Path):
        return str(value)
    return value


# --------------------------------------------------------------------------
# The spiral demo
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SpiralConfig:
    """Settings of ``jaxwise spiral`` (the defaults are the documented demo)."""

    epochs: int = 150
    batch_size: int = 128
    noise: float = 0.15
    seed: int = 0
    out: str | None = "runs/spiral"
    dp: bool = False
    clip_norm: float = 1.0
    noise_multiplier: float = 1.1
    n_per_class: int = 600
    hidden: tuple[int, ...] = (64, 64)
    lr: float = 1e-2
    end_lr: float = 1e-4
    warmup: int = 100
    weight_decay: float = 1e-4
    progress: bool = True

    def validate(self) -> None:
        _check_training_options(self)
        if not 0 <= self.noise < 10:
            raise UserError(f"--noise must be in [0, 10), got {self.noise}")


def run_spiral(cfg: SpiralConfig = SpiralConfig()) -> dict[str, Any]:
    """Train the spiral classifier with every practice in place; return the summary.

    One compiled ``lax.scan`` program per epoch (asserted: exactly one
    compilation), the state donated (checked: the initial parameter buffers
    are gone, the data buffers are not), logits / cross-entropy / accuracy
    re-computed in NumPy float64, hard examples found by per-example
    gradient norms, PNG plots in ``cfg.out``.
    """
    cfg.validate()
    t_start = time.perf_counter()
    out = Path(cfg.out) if cfg.out else None
    _check_out(out)
    x, y = data.make_spiral(cfg.n_per_class, 3, cfg.noise, seed=cfg.seed)
    xtr, xte, ytr, yte = data.train_test_split(x, y, test_fraction=0.2, seed=cfg.seed)
    if cfg.batch_size > len(xtr):
        raise UserError(f"--batch-size {cfg.batch_size} exceeds the {len(xtr)} training examples")
    steps_per_epoch = len(xtr) // cfg.batch_size if not cfg.dp else max(1, round(len(xtr) / cfg.batch_size))
    total_steps = cfg.epochs * steps_per_epoch
    tx, schedule = make_optimizer(total_steps, cfg.lr, cfg.weight_decay, cfg.warmup, cfg.end_lr)
    key = jax.random.key(cfg.seed)
    init_key, state_key = jax.random.split(key)
    params = init_mlp(init_key, (2, *cfg.hidden, 3))
    state = TrainState.create(params, tx, state_key)
    initial_buffers = jax.tree.leaves(state.params)
    train_data = (jnp.asarray(xtr), jnp.asarray(ytr))

    epoch, budget_name = _make_epoch(tx, cfg)
    step_losses = []
    t_train = time.perf_counter()
    with CompileCounter() as everything, CompileBudget(1, name=budget_name, on_exceed="warn") as budget:
        with _progress(cfg.progress, cfg.epochs, "spiral") as advance:
            for _ in range(cfg.epochs):
                state, metrics = epoch(state, train_data)
                loss, acc = (float(v) for v in _evaluate(state.params, *train_data))  # whole training set
                if cfg.dp:  # DP steps report no per-step loss
                    step_losses.append(np.full(steps_per_epoch, loss))
                else:
                    step_losses.append(np.asarray(metrics["loss"]))
                advance(loss=loss, acc=acc)
    jax.block_until_ready(state)
    train_seconds = time.perf_counter() - t_train
    step_losses = np.concatenate(step_losses)

    train_acc, test_acc = _accuracy(state.params, xtr, ytr), _accuracy(state.params, xte, yte)
    f64 = _float64_check(state.params, np.concatenate([xtr, xte]), np.concatenate([ytr, yte]))
    donated = all(leaf.is_deleted() for leaf in initial_buffers)
    data_kept = not any(leaf.is_deleted() for leaf in train_data)

    idx, norms = _hardest(state.params, *train_data)
    hard = _describe_examples(state.params, xtr, ytr, np.asarray(idx), np.asarray(norms))

    checks = {
        "compiles_once": {"ok": budget.count == 1, "detail": f"{budget_name} compiled {budget.count}× (budget 1)"},
        "state_donated": {"ok": donated, "detail": "initial parameter buffers deleted by donation"},
        "data_not_donated": {"ok": data_kept, "detail": "training data buffers still alive"},
        "float64_logits": {"ok": f64["max_logit_error"] < 1e-4,
                           "detail": f"max |logit − float64| = {f64['max_logit_error']:.2e} (< 1e-4)"},
        "float64_cross_entropy": {"ok": f64["cross_entropy_error"] < 1e-4,
                                  "detail": f"|CE − float64 CE| = {f64['cross_entropy_error']:.2e}"},
        "float64_accuracy": {"ok": abs(f64["accuracy_float64"] - f64["accuracy_float32"]) <= 1 / len(y),
                             "detail": f"float32 {f64['accuracy_float32']:.4f} vs float64 {f64['accuracy_float64']:.4f}"},
    }
    if not cfg.dp:
        checks["accuracy"] = {"ok": train_acc > 0.95 and test_acc > 0.95,
                              "detail": f"train {train_acc:.3f}, test {test_acc:.3f} (> 0.95)"}

    outputs = {}
    if out is not None:
        from jaxwise.plotting import plot_decision_boundary, plot_training

        lrs = np.asarray(_schedule_values(schedule, total_steps))
        outputs["loss_plot"] = str(plot_training(out / "loss.png", step_losses, steps_per_epoch, lrs,
                                                 title="spiral: training loss"))
        outputs["boundary_plot"] = str(plot_decision_boundary(
            out / "decision_boundary.png", _predict_proba(state.params), xtr, ytr, highlight=np.asarray(idx),
            title=f"spiral: decision boundary (test accuracy {test_acc:.1%})"))

    summary: dict[str, Any] = {
        "job": "spiral",
        "compiles": budget.count,
        "compiles_total": everything.count,
        "train_accuracy": train_acc,
        "test_accuracy": test_acc,
        "final_loss": float(step_losses[-steps_per_epoch:].mean()),
        "epochs": cfg.epochs,
        "steps": total_steps,
        "parameters": param_table(state.params).total_count,
        "timings": {"total_s": time.perf_counter() - t_start, "train_s": train_seconds,
                    "compile_s": budget.seconds},
        "float64": f64,
        "checks": checks,
        "ok": all(c["ok"] for c in checks.values()),
        "hard_examples": hard,
        "outputs": outputs,
        "params_sha256": _params_digest(state.params),
    }
    if cfg.dp:
        summary["dp"] = _dp_report(cfg, len(xtr), total_steps)
    return _jsonable(summary)


@jax.jit
def _hardest(params: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The 5 training examples with the largest gradient norms (chunked per-example gradients)."""
    return hardest_examples(PER_EXAMPLE_LOSS, params, x, y, k=5, chunk_size=256)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _schedule_values(schedule: Callable[[jax.Array], jax.Array], steps: int) -> jax.Array:
    """The learning rate at every step, for the plot (one compiled program, not one per op)."""
    return jax.vmap(schedule)(jnp.arange(steps))


def _describe_examples(params: Any, x: np.ndarray, y: np.ndarray, idx: np.ndarray, norms: np.ndarray
                       ) -> list[dict[str, Any]]:
    probs = _predict_proba(params)(x[idx])
    rows = []
    for j, (i, norm) in enumerate(zip(idx, norms)):
        rows.append({
            "index": int(i),
            "x": [float(v) for v in x[i]],
            "true": int(y[i]),
            "predicted": int(probs[j].argmax()),
            "p_true": float(probs[j][y[i]]),
            "grad_norm": float(norm),
            "loss": float(-np.log(max(probs[j][y[i]], 1e-45))),
        })
    return rows


# --------------------------------------------------------------------------
# Training on a CSV, and label errors
# --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TabularConfig:
    """Settings of ``jaxwise train`` / ``jaxwise label-errors``."""

    path: str
    label: str
    hidden: tuple[int, ...] = (64, 64)
    epochs: int = 50
    batch_size: int = 128
    lr: float = 1e-2
    weight_decay: float = 1e-4
    val_fraction: float = 0.2
    seed: int = 0
    out: str | None = "runs/train"
    drop_na: bool = False
    resume: bool = False
    stop_after: int | None = None
    dp: bool = False
    clip_norm: float = 1.0
    noise_multiplier: float = 1.1
    progress: bool = True

    def validate(self) -> None:
        _check_training_options(self)
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise UserError(f"--hidden must be positive layer widths like 64,64, got {self.hidden}")
        if not 0.0 < self.val_fraction < 0.9:
            raise UserError(f"--val-fraction must be in (0, 0.9), got {self.val_fraction}")
        if self.lr <= 0:
            raise UserError(f"--lr must be > 0, got {self.lr}")
        if self.stop_after is not None and not 1 <= self.stop_after <= self.epochs:
            raise UserError(f"--stop-after must be in [1, --epochs], got {self.stop_after}")

    def fingerprint(self) -> dict[str, Any]:
        """The settings a resumed run must share with the checkpoint."""
        keys = ("label", "hidden", "epochs", "batch_size", "lr", "weight_decay", "val_fraction", "seed", "dp",
                "clip_norm", "noise_multiplier", "drop_na")
        return {k: _jsonable(getattr(self, k)) for k in keys}


@dataclasses.dataclass(frozen=True)
class _Prepared:
    table: data.Table
    x_all: np.ndarray  # standardised
    train_idx: np.ndarray
    val_idx: np.ndarray
    mean: np.ndarray
    std: np.ndarray


def _prepare(cfg: TabularConfig) -> _Prepared:
    try:
        table = data.load_csv(cfg.path, cfg.label, drop_na=cfg.drop_na)
    except data.DataError as err:
        raise UserError(str(err)) from err
    n = len(table.y)
    order = np.random.default_rng(cfg.seed).permutation(n)
    n_val = max(1, int(round(n * cfg.val_fraction)))
    val_idx, train_idx = np.sort(order[:n_val]), np.sort(order[n_val:])
    if len(train_idx) < cfg.batch_size:
        raise UserError(
            f"{cfg.path}: {len(train_idx)} training rows (after the {cfg.val_fraction:.0%} validation split) "
            f"is fewer than --batch-size {cfg.batch_size}; lower --batch-size"
        )
    mean = table.x[train_idx].mean(0)
    std = table.x[train_idx].std(0)
    std = np.where(std > 0, std, 1.0)
    x_all = ((table.x - mean) / std).astype(np.float32)
    return _Prepared(table, x_all, train_idx, val_idx, mean, std)


def _train_tabular(cfg: TabularConfig) -> tuple[dict[str, Any], Any, _Prepared]:
    """Shared by ``train`` and ``label-errors``: returns (summary, params, prepared data)."""
    cfg.validate()
    t_start = time.perf_counter()
    out = Path(cfg.out) if cfg.out else None
    prep = _prepare(cfg)
    _check_out(out)
    ckpt = out / "checkpoint" if out is not None else None
    if ckpt is not None and not cfg.resume and latest_step(ckpt) is not None:
        raise UserError(f"{ckpt} already holds a checkpoint; pass --resume to continue it, or choose another --out")
    table = prep.table
    n_classes, n_features = len(table.classes), table.x.shape[1]
    xtr, ytr = prep.x_all[prep.train_idx], table.y[prep.train_idx]
    xva, yva = prep.x_all[prep.val_idx], table.y[prep.val_idx]
    steps_per_epoch = len(xtr) // cfg.batch_size if not cfg.dp else max(1, round(len(xtr) / cfg.batch_size))
    total_steps = cfg.epochs * steps_per_epoch
    tx, schedule = make_optimizer(total_steps, cfg.lr, cfg.weight_decay, min(100, total_steps // 10), cfg.lr / 100)
    init_key, state_key = jax.random.split(jax.random.key(cfg.seed))
    state = TrainState.create(init_mlp(init_key, (n_features, *cfg.hidden, n_classes)), tx, state_key)

    start_epoch = 0
    if cfg.resume:
        state, start_epoch = _resume(cfg, ckpt, state, table)

    epoch, budget_name = _make_epoch(tx, cfg)
    train_data = (jnp.asarray(xtr), jnp.asarray(ytr))
    last_epoch = cfg.stop_after if cfg.stop_after is not None else cfg.epochs
    last_epoch = max(last_epoch, start_epoch)
    epoch_losses: list[float] = []
    t_train = time.perf_counter()
    with CompileBudget(1, name=budget_name, on_exceed="warn") as budget:
        with _progress(cfg.progress, cfg.epochs, Path(cfg.path).name, completed=start_epoch) as advance:
            for _ in range(start_epoch, last_epoch):
                state, metrics = epoch(state, train_data)
                loss, acc = (float(v) for v in _evaluate(state.params, *train_data))
                epoch_losses.append(loss)
                advance(loss=loss, acc=acc)
    jax.block_until_ready(state)
    train_seconds = time.perf_counter() - t_train

    if ckpt is not None and latest_step(ckpt) != int(state.step):
        meta = {"epoch": last_epoch, "config": cfg.fingerprint(), "classes": list(table.classes),
                "feature_names": list(table.feature_names), "mean": prep.mean.tolist(), "std": prep.std.tolist()}
        save(ckpt, state, meta)

    val_pred = np.asarray(jax.jit(mlp_apply)(state.params, jnp.asarray(xva)).argmax(-1))
    confusion = np.zeros((n_classes, n_classes), np.int64)
    np.add.at(confusion, (yva, val_pred), 1)
    outputs: dict[str, str] = {}
    if out is not None:
        from jaxwise.plotting import plot_confusion, plot_training

        outputs["confusion_plot"] = str(plot_confusion(out / "confusion.png", confusion, table.classes))
        if epoch_losses:
            lrs = np.asarray(_schedule_values(schedule, total_steps))
            per_step = np.repeat(np.asarray(epoch_losses), steps_per_epoch)
            outputs["loss_plot"] = str(plot_training(out / "loss.png", per_step, steps_per_epoch,
                                                     lrs[start_epoch * steps_per_epoch:], title="training loss"))
        outputs["checkpoint"] = str(ckpt)
    summary: dict[str, Any] = {
        "job": "train",
        "compiles": budget.count,
        "train_accuracy": _accuracy(state.params, xtr, ytr),
        "test_accuracy": float((val_pred == yva).mean()),
        "epochs_completed": last_epoch,
        "epochs": cfg.epochs,
        "resumed_from_epoch": start_epoch if cfg.resume else None,
        "rows": int(len(table.y)),
        "dropped_rows": table.dropped,
        "train_rows": int(len(xtr)),
        "validation_rows": int(len(xva)),
        "features": list(table.feature_names),
        "classes": list(table.classes),
        "confusion_matrix": confusion,
        "final_loss": epoch_losses[-1] if epoch_losses else None,
        "timings": {"total_s": time.perf_counter() - t_start, "train_s": train_seconds, "compile_s": budget.seconds},
        "outputs": outputs,
        "params_sha256": _params_digest(state.params),
    }
    if cfg.dp:
        summary["dp"] = _dp_report(cfg, len(xtr), int(state.step))
    return summary, state.params, prep


def _resume(cfg: TabularConfig, ckpt: Path | None, state: TrainState, table: data.Table) -> tuple[TrainState, int]:
    if ckpt is None:
        raise UserError("--resume needs --out (the checkpoint lives in OUT/checkpoint)")
    if latest_step(ckpt) is None:
        raise UserError(f"--resume: no checkpoint in {ckpt}")
    meta = load_metadata(ckpt)
    saved, now = meta.get("config", {}), cfg.fingerprint()
    for key in now:
        if saved.get(key) != now[key]:
            raise UserError(f"--resume: the checkpoint was trained with {key}={saved.get(key)!r}, got {now[key]!r}")
    if meta.get("classes") != list(table.classes) or meta.get("feature_names") != list(table.feature_names):
        raise UserError(f"--resume: {cfg.path} has different columns or classes than the checkpointed run")
    return restore(ckpt, like=state), int(meta["epoch"])


def run_train(cfg: TabularConfig) -> dict[str, Any]:
    """Train an MLP classifier on a CSV; return the summary (accuracy, confusion matrix, outputs)."""
    summary, _, _ = _train_tabular(cfg)
    return _jsonable(summary)


def run_label_errors(cfg: TabularConfig, top: int, suspects_csv: str | os.PathLike[str]) -> dict[str, Any]:
    """Train as :func:`run_train`, then write the ``top`` most suspicious rows to ``suspects_csv``.

    Rows are ranked by the per-example gradient norm of the trained model
    over the whole file; columns ``row`` (0-based data row), ``given_label``,
    ``predicted_label``, ``p_given``, ``grad_norm``, ``loss``.
    """
    if top < 1:
        raise UserError(f"--top must be >= 1, got {top}")
    target = Path(suspects_csv)
    _check_out(target.parent if str(target.parent) else Path("."))
    summary, params, prep = _train_tabular(cfg)
    table = prep.table
    top = min(top, len(table.y))
    x_all, y_all = jnp.asarray(prep.x_all), jnp.asarray(table.y)
    norms = per_example_grad_norms(PER_EXAMPLE_LOSS, params, x_all, y_all, method="ghost")
    _, idx = jax.lax.top_k(norms, top)
    idx = np.asarray(idx)
    probs = _predict_proba(params)(prep.x_all[idx])
    rows = []
    for j, i in enumerate(idx):
        given = int(table.y[i])
        rows.append({
            "row": int(table.rows[i]),
            "given_label": table.classes[given],
            "predicted_label": table.classes[int(probs[j].argmax())],
            "p_given": float(probs[j][given]),
            "grad_norm": float(norms[i]),
            "loss": float(-np.log(max(float(probs[j][given]), 1e-45))),
        })
    _write_csv(target, rows)
    summary = dict(summary, job="label-errors", suspects=rows, outputs=dict(summary["outputs"], suspects=str(target)))
    return _jsonable(summary)


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    import csv

    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["row", "given_label", "predicted_label", "p_given", "grad_norm", "loss"])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    os.replace(tmp, path)


"""``jaxwise spiral``: the main job, in four phases (prepare, fit, verify, report).

Examples:
    >>> cfg = SpiralConfig(epochs=2, n_per_class=60, out=None, progress=False, cache=False)
    >>> summary = run_spiral(cfg)
    >>> summary["compiles"], summary["skipped"], 0.0 <= summary["test_accuracy"] <= 1.0
    (1, 0, True)
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import data
from jaxwise._checks import UserError
from jaxwise.jobs import _common as C
from jaxwise.jobs._cache import CompileTally, default_cache_dir, persistent_cache
from jaxwise.jobs._outputs import RunDir, hold_for_tests
from jaxwise.label_errors import hardest_examples
from jaxwise.models import init_mlp
from jaxwise.train import TrainState
from jaxwise.tree import param_table

__all__ = ["SpiralConfig", "run_spiral"]

OUTPUT_NAMES = ("loss.png", "decision_boundary.png")


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
    plots: bool = True
    cache: bool = True
    cache_dir: str | None = None

    def validate(self) -> None:
        C.check_training_options(self)
        C.option_float(self.noise, "--noise", min_value=0.0, max_value=10.0, max_inclusive=False)


@dataclasses.dataclass
class _Run:
    """What the phases hand to each other."""

    cfg: SpiralConfig
    out: RunDir | None
    xtr: np.ndarray
    xte: np.ndarray
    ytr: np.ndarray
    yte: np.ndarray
    steps_per_epoch: int
    state: Any = None
    tx: Any = None
    schedule: Any = None
    initial_buffers: list[Any] = dataclasses.field(default_factory=list)
    train_data: tuple[Any, ...] = ()
    step_losses: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    skipped: int = 0
    tally: CompileTally = dataclasses.field(default_factory=CompileTally)
    train_seconds: float = 0.0


def run_spiral(cfg: SpiralConfig = SpiralConfig()) -> dict[str, Any]:
    """Train the spiral classifier with every practice in place; return the summary.

    One compiled ``lax.scan`` program per epoch (asserted: exactly one compilation, or one
    load from the persistent compilation cache), the state donated (checked: the initial
    parameter buffers are gone, the data buffers are not), logits / cross-entropy / accuracy
    re-computed in NumPy float64, hard examples found by per-example gradient norms, PNG
    plots in ``cfg.out``.
    """
    cfg.validate()
    t_start = time.perf_counter()
    cache_dir = (
        (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()) if cfg.cache else None
    )
    out_dir = (
        RunDir(cfg.out, "--out", OUTPUT_NAMES, "spiral")
        if cfg.out and cfg.plots
        else contextlib.nullcontext(None)
    )
    with out_dir as out, persistent_cache(cache_dir) as cache_dir:
        hold_for_tests()
        run = prepare(cfg, out)
        fit(run)
        checks, f64, hard = verify(run)
        return report(run, checks, f64, hard, time.perf_counter() - t_start, cache_dir)


def prepare(cfg: SpiralConfig, out: RunDir | None = None) -> _Run:
    """Data, split, output directory (``out``, locked: claimed here), optimizer, initial state."""
    if out is not None:
        out.claim({}, can_force=False)  # the demo's plots: re-runs replace them
    x, y = data.make_spiral(cfg.n_per_class, 3, cfg.noise, seed=cfg.seed)
    xtr, xte, ytr, yte = data.train_test_split(x, y, test_fraction=0.2, seed=cfg.seed)
    if cfg.batch_size > len(xtr):
        raise UserError(f"--batch-size {cfg.batch_size} exceeds the {len(xtr)} training examples")
    run = _Run(cfg, out, xtr, xte, ytr, yte, C.steps_per_epoch(len(xtr), cfg))
    run.tx, run.schedule = C.make_optimizer(
        cfg.epochs * run.steps_per_epoch, cfg.lr, cfg.weight_decay, cfg.warmup, cfg.end_lr
    )
    init_key, state_key = jax.random.split(jax.random.key(cfg.seed))
    run.state = TrainState.create(init_mlp(init_key, (2, *cfg.hidden, 3)), run.tx, state_key)
    run.initial_buffers = jax.tree.leaves(run.state.params)
    run.train_data = (jnp.asarray(xtr), jnp.asarray(ytr))
    return run


def fit(run: _Run) -> None:
    """The epochs: one compiled program, counted (compiled vs loaded from the cache)."""
    cfg = run.cfg
    epoch = C.make_epoch(run.tx, cfg)
    losses = []
    t_train = time.perf_counter()
    with C.progress(cfg.progress, cfg.epochs, "spiral") as advance:
        for _ in range(cfg.epochs):
            with run.tally.measure():
                run.state, metrics = epoch(run.state, run.train_data)
            loss, acc = (float(v) for v in C.evaluate(run.state.params, *run.train_data))
            step_losses, skipped = C.step_metrics(metrics, run.steps_per_epoch)
            losses.append(
                step_losses if step_losses is not None else np.full(run.steps_per_epoch, loss)
            )
            run.skipped += skipped
            advance(loss=loss, acc=acc)
    jax.block_until_ready(run.state)
    run.train_seconds = time.perf_counter() - t_train
    run.step_losses = np.concatenate(losses)


def verify(run: _Run) -> tuple[dict[str, dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """The guarantees checked at run time, the float64 figures and the hardest examples."""
    cfg, params = run.cfg, run.state.params
    C.check_run_health(
        float(run.step_losses[-run.steps_per_epoch :].mean()),
        run.skipped,
        cfg.epochs * run.steps_per_epoch,
        "spiral",
    )
    train_acc, test_acc = C.accuracy(params, run.xtr, run.ytr), C.accuracy(params, run.xte, run.yte)
    n = len(run.ytr) + len(run.yte)
    f64 = C.float64_check(
        params, np.concatenate([run.xtr, run.xte]), np.concatenate([run.ytr, run.yte])
    )
    f64.update(train_accuracy=train_acc, test_accuracy=test_acc)
    tally = run.tally
    checks = {
        "compiles_once": {
            "ok": tally.total == 1,
            "detail": tally.describe("the epoch program") + " (budget 1)",
        },
        "state_donated": {
            "ok": all(leaf.is_deleted() for leaf in run.initial_buffers),
            "detail": "initial parameter buffers deleted by donation",
        },
        "data_not_donated": {
            "ok": not any(leaf.is_deleted() for leaf in run.train_data),
            "detail": "training data buffers still alive",
        },
        "float64_logits": {
            "ok": f64["max_logit_error"] < 1e-4,
            "detail": f"max |logit − float64| = {f64['max_logit_error']:.2e} (< 1e-4)",
        },
        "float64_cross_entropy": {
            "ok": f64["cross_entropy_error"] < 1e-4,
            "detail": f"|CE − float64 CE| = {f64['cross_entropy_error']:.2e}",
        },
        "float64_accuracy": {
            "ok": abs(f64["accuracy_float64"] - f64["accuracy_float32"]) <= 1 / n,
            "detail": f"float32 {f64['accuracy_float32']:.4f} vs float64 "
            f"{f64['accuracy_float64']:.4f}",
        },
    }
    if not cfg.dp:
        checks["accuracy"] = {
            "ok": train_acc > 0.95 and test_acc > 0.95,
            "detail": f"train {train_acc:.3f}, test {test_acc:.3f} (> 0.95)",
        }
    idx, norms = _hardest(params, *run.train_data)
    return (
        checks,
        f64,
        _describe_examples(params, run.xtr, run.ytr, np.asarray(idx), np.asarray(norms)),
    )


def report(
    run: _Run,
    checks: dict[str, Any],
    f64: dict[str, Any],
    hard: list[dict[str, Any]],
    total_seconds: float,
    cache_dir: Path | None,
) -> dict[str, Any]:
    """Plots (unless ``--no-plots``) and the JSON-ready summary."""
    cfg, params = run.cfg, run.state.params
    train_acc, test_acc = f64.pop("train_accuracy"), f64.pop("test_accuracy")
    outputs = _plots(run, hard, test_acc) if run.out is not None else {}
    total_steps = cfg.epochs * run.steps_per_epoch
    summary: dict[str, Any] = {
        "schema": 1,
        "job": "spiral",
        "compiles": run.tally.total,
        "compile": run.tally.as_dict(cache_dir),
        "train_accuracy": train_acc,
        "test_accuracy": test_acc,
        "val_accuracy": test_acc,
        "final_loss": float(run.step_losses[-run.steps_per_epoch :].mean()),
        "skipped": run.skipped,
        "epochs": cfg.epochs,
        "steps": total_steps,
        "parameters": param_table(params).total_count,
        "timings": {
            "total_s": total_seconds,
            "train_s": run.train_seconds,
            "compile_s": run.tally.seconds,
        },
        "float64": f64,
        "checks": checks,
        "ok": all(c["ok"] for c in checks.values()),
        "hard_examples": hard,
        "outputs": outputs,
        "params_sha256": C.params_digest(params),
    }
    if cfg.dp:
        summary["dp"] = C.dp_report(cfg, len(run.xtr), total_steps)
    return C.jsonable(summary)


def _plots(run: _Run, hard: list[dict[str, Any]], test_acc: float) -> dict[str, str]:
    from jaxwise._plotting import plot_decision_boundary, plot_training

    assert run.out is not None
    lrs = np.asarray(C.schedule_values(run.schedule, run.cfg.epochs * run.steps_per_epoch))
    idx = [int(h["index"]) for h in hard]
    return {
        "loss_plot": str(
            plot_training(
                run.out / "loss.png",
                run.step_losses,
                run.steps_per_epoch,
                lrs,
                title="spiral: training loss",
            )
        ),
        "boundary_plot": str(
            plot_decision_boundary(
                run.out / "decision_boundary.png",
                C.predict_proba(run.state.params),
                run.xtr,
                run.ytr,
                highlight=idx,
                title=f"spiral: decision boundary (test accuracy {test_acc:.1%})",
            )
        ),
    }


@jax.jit
def _hardest(params: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The 5 training examples with the largest gradient norms (chunked per-example gradients)."""
    return hardest_examples(C.per_example_loss(), params, (x, y), k=5, chunk_size=256)


def _describe_examples(
    params: Any, x: np.ndarray, y: np.ndarray, idx: np.ndarray, norms: np.ndarray
) -> list[dict[str, Any]]:
    probs = C.predict_proba(params)(x[idx])
    return [
        {
            "index": int(i),
            "x": [float(v) for v in x[i]],
            "true": int(y[i]),
            "predicted": int(probs[j].argmax()),
            "p_true": float(probs[j][y[i]]),
            "grad_norm": float(norm),
            "loss": float(-np.log(max(probs[j][y[i]], 1e-45))),
        }
        for j, (i, norm) in enumerate(zip(idx, norms))
    ]

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
import functools
import itertools
import math
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise import data, numerics
from jaxwise._shared._checks import UserError
from jaxwise.cli._jobs import _common as C
from jaxwise.cli._jobs._cache import CompileTally, default_cache_dir, persistent_cache
from jaxwise.cli._jobs._fitting import LOG_DIRS, EpochLog, Progress, check_logs, open_writers
from jaxwise.cli._jobs._outputs import SUMMARY, RunDir, atomic_write, hold_for_tests, write_summary
from jaxwise.cli._jobs._overlap import compile_one_shot, overlapped, precompile
from jaxwise.label_errors import hardest_examples
from jaxwise.models import mlp_apply
from jaxwise.train import MetricLogging
from jaxwise.train import fit as train_fit
from jaxwise.tree import param_table

__all__ = ["SpiralConfig", "run_spiral"]

OUTPUT_NAMES = ("loss.png", "decision_boundary.png", SUMMARY, "metrics.jsonl", *LOG_DIRS.values())

# The matmul precision of the logits the float64 guarantees check (training runs at the
# backend's default): "highest" checks the mathematics on every backend (a TPU's default is
# one bfloat16 pass, ~3 digits). "bfloat16" computes them with bfloat16 operands on any
# backend (the low-precision path the guarantees' tolerances are tested with).
VERIFY_PRECISION = "highest"


@dataclasses.dataclass(frozen=True)
class SpiralConfig:
    """Settings of ``jaxwise spiral`` (the defaults are the documented demo).

    Attributes:
        epochs: training epochs.
        batch_size: mini-batch size.
        noise: angle noise of the spiral data.
        seed: seed of the data split, the initialisation and the shuffles.
        out: the output directory (``None``: write nothing).
        dp: train with DP-SGD (``--dp``).
        clip_norm: the per-example clipping norm with ``dp``.
        noise_multiplier: the noise multiplier σ with ``dp``.
        audit: ``--audit M``: audit the DP run with M canaries (``None``: no audit).
        mechanism: ``--mechanism``: ``dpsgd``, ``bandmf``, ``blt`` or ``auto`` (``None``:
            DP-SGD).
        bands: ``--bands``: BandMF's bands (``None``: chosen).
        adaptive_clip: ``--adaptive-clip Q``: the clip norm tracks the Q-quantile of the
            gradient norms, starting at ``clip_norm`` (``None``: a fixed clip).
        n_per_class: points per spiral arm.
        hidden: widths of the hidden layers.
        lr: peak learning rate (after the warm-up).
        end_lr: final learning rate of the cosine decay.
        warmup: warm-up steps.
        weight_decay: AdamW's decoupled weight decay.
        progress: show a progress bar.
        plots: write the PNG plots.
        cache: use the persistent compilation cache.
        cache_dir: its directory (``None``: `default_cache_dir`).
        log: ``--log``: the metric writers besides ``metrics.jsonl`` (``"tensorboard"``,
            ``"mlflow"``), in ``out``.
    """

    epochs: int = 150
    batch_size: int = 128
    noise: float = 0.15
    seed: int = 0
    out: str | None = "runs/spiral"
    dp: bool = False
    clip_norm: float = 1.0
    noise_multiplier: float = 1.1
    audit: int | None = None
    mechanism: str | None = None
    bands: int | None = None
    adaptive_clip: float | None = None
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
    log: tuple[str, ...] = ()

    def validate(self) -> None:
        """Check every setting (before any work).

        Raises:
            UserError: a setting is out of range; the message names its option.
        """
        C.check_training_options(self)
        C.option_float(self.noise, "--noise", min_value=0.0, max_value=10.0, max_inclusive=False)
        C.check_dp_options(self)
        C.check_audit_option(self)
        check_logs(self.log)


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
    state_shape: Any = None
    pending_state: Future[Any] | None = None
    verification: Future[Any] | None = None
    tx: Any = None
    schedule: Any = None
    initial_buffers: list[Any] = dataclasses.field(default_factory=list)
    train_data: tuple[Any, ...] = ()
    test_data: tuple[Any, ...] = ()
    fit_data: tuple[Any, ...] = ()  # the training data, with the included canaries (--audit)
    canaries: Any = None
    audit: dict[str, Any] | None = None
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
    plots in ``cfg.out``. The initial state and the evaluation and verification programs are
    built in a background thread while the epoch program compiles (``jobs._overlap``).

    Args:
        cfg: the settings (the defaults are the demo).

    Returns:
        The JSON-ready summary (``compiles``, ``train_accuracy``, ``test_accuracy``, …).
    """
    cfg.validate()
    t_start = time.perf_counter()
    cache_dir = (
        (Path(cfg.cache_dir) if cfg.cache_dir else default_cache_dir()) if cfg.cache else None
    )
    out_dir = (
        RunDir(cfg.out, "--out", OUTPUT_NAMES, "spiral")
        if cfg.out and (cfg.plots or cfg.log)
        else contextlib.nullcontext(None)
    )
    with out_dir as out, persistent_cache(cache_dir) as cache_dir, overlapped() as background:
        hold_for_tests()
        run = prepare(cfg, background, out)
        fit(run)
        checks, f64, hard = verify(run)
        summary = report(run, checks, f64, hard, time.perf_counter() - t_start, cache_dir)
        write_summary(out, summary)
        return summary


def prepare(cfg: SpiralConfig, background: ThreadPoolExecutor, out: RunDir | None = None) -> _Run:
    """Data, split, output directory, optimizer; the initial state and programs, in ``background``.

    The output directory (``out``, locked) is claimed first. The background thread compiles
    and runs the program that builds the initial state, then compiles the verification
    program, from the shapes the state will have (one trace, here); meanwhile the main thread
    compiles the epoch program (`fit`).
    """
    if out is not None:
        out.claim({}, can_force=False)  # the demo's plots: re-runs replace them
    x, y = data.make_spiral(cfg.n_per_class, 3, cfg.noise, seed=cfg.seed)
    xtr, xte, ytr, yte = data.train_test_split(x, y, test_fraction=0.2, seed=cfg.seed)
    if cfg.batch_size > len(xtr):
        raise UserError(f"--batch-size {cfg.batch_size} exceeds the {len(xtr)} training examples")
    fit_x, fit_y, canaries = xtr, ytr, None
    if cfg.audit:
        canaries = C.audit_canaries_for(cfg, xtr, ytr, 3)
        fit_x, fit_y = canaries.train_data((xtr, ytr))
    run = _Run(cfg, out, xtr, xte, ytr, yte, C.steps_per_epoch(len(fit_x), cfg))
    run.tx, run.schedule = C.make_optimizer(
        cfg.epochs * run.steps_per_epoch, cfg.lr, cfg.weight_decay, cfg.warmup, cfg.end_lr
    )
    sizes = (fit_x.shape[1], *cfg.hidden, 3)  # with --audit: one input per canary feature
    gradient = C.run_gradient(cfg, len(fit_x))  # the DP noise buffers / adaptive clip
    build = jax.jit(functools.partial(C.initial_state, run.tx, sizes, cfg.seed, gradient))
    run.state_shape = jax.eval_shape(build)
    run.pending_state = background.submit(lambda: compile_one_shot(build)())
    run.train_data, run.test_data = C.to_device(xtr, ytr), C.to_device(xte, yte)
    run.fit_data = run.train_data if canaries is None else C.to_device(fit_x, fit_y)
    run.canaries = canaries
    if cfg.dp:  # evaluated after every epoch (DP epochs report no loss of their own)
        background.submit(precompile, C.evaluate, run.state_shape.params, *run.fit_data)
    model = run.state_shape.params  # the verified model: without the canaries' features
    if canaries is not None:
        model = jax.eval_shape(
            lambda: C.initial_state(run.tx, (2, *cfg.hidden, 3), cfg.seed).params
        )
    verification = jax.jit(functools.partial(_verification, precision=VERIFY_PRECISION))
    run.verification = background.submit(
        compile_one_shot, verification, model, *run.train_data, *run.test_data
    )
    return run


class _Epoch:
    """One spiral epoch as a `train.fit` step: the compiled epoch, its losses kept for the plot.

    Its metrics are the epoch's mean mini-batch loss and accuracy, from the epoch program's own
    metrics (no second program, no extra pass over the data); DP-SGD epochs report no loss, so
    the training set is evaluated after each of them.
    """

    def __init__(self, run: _Run, epoch: Any) -> None:
        self.run, self.epoch = run, epoch
        self.losses: list[np.ndarray] = []

    def __call__(self, state: Any, data: Any) -> tuple[Any, dict[str, Any]]:
        run = self.run
        with run.tally.measure():
            state, metrics = self.epoch(state, data)
        step_losses, skipped = C.step_metrics(metrics, run.steps_per_epoch)
        if step_losses is None:  # DP epochs report no loss: evaluate the training set
            loss, acc = (float(v) for v in C.evaluate(state.params, *run.fit_data))
            step_losses, fields = np.full(run.steps_per_epoch, loss), {"loss": loss, "acc": acc}
        else:
            fields = C.epoch_progress(metrics, step_losses)
        self.losses.append(step_losses)
        return state, {
            "loss": fields["loss"],
            "accuracy": fields.get("acc", math.nan),
            "skipped": skipped,
        }


def fit(run: _Run) -> None:
    """The epochs through `train.fit`: one compiled program, counted (compiled vs from cache)."""
    cfg = run.cfg
    step = _Epoch(run, C.build_epoch(cfg, accuracy=True, n_train=len(run.fit_data[1])))
    with run.tally.measure():  # the epoch program, compiled while the state is built
        precompile(step.epoch.jitted, run.state_shape, run.fit_data)
    assert run.pending_state is not None
    run.state = run.pending_state.result()
    run.initial_buffers = jax.tree.leaves(run.state.params)
    with (
        C.progress(cfg.progress, cfg.epochs, "spiral") as advance,
        contextlib.ExitStack() as stack,
    ):
        run.state, report = train_fit(
            step,
            run.state,
            itertools.repeat(run.fit_data),
            steps=cfg.epochs,
            prefetch=0,
            callbacks=[Progress(advance), MetricLogging(_writers(run, stack))],
        )
    run.train_seconds = report.seconds
    run.skipped = report.skipped
    run.step_losses = np.concatenate(step.losses)
    if run.canaries is not None:  # score the canaries, then drop their input features
        run.audit, params = C.audit_run(run.state.params, run.canaries, run.xtr.shape[1])
        run.state = run.state.replace(params=params)


def _writers(run: _Run, stack: contextlib.ExitStack) -> list[Any]:
    """``OUT/metrics.jsonl`` (a new run's: a re-run replaces it) and the ``--log`` writers."""
    if run.out is None:
        return []
    out = run.out
    atomic_write(out / "metrics.jsonl", lambda f: f.write(""))
    writers = [EpochLog(out / "metrics.jsonl", [])]
    writers += open_writers(run.cfg.log, lambda name: out / name, out.run_id or "spiral", {})
    for w in writers:
        stack.callback(w.close)
    return writers


def verify(run: _Run) -> tuple[dict[str, dict[str, Any]], dict[str, Any], list[dict[str, Any]]]:
    """The guarantees checked at run time, the float64 figures and the hardest examples."""
    cfg, params = run.cfg, run.state.params
    C.check_run_health(
        float(run.step_losses[-run.steps_per_epoch :].mean()),
        run.skipped,
        cfg.epochs * run.steps_per_epoch,
        "spiral",
    )
    assert run.verification is not None
    verification = run.verification.result()  # compiled in the background during training
    logits, ce32, hard_idx, hard_norms = (
        np.asarray(v) for v in verification(params, *run.train_data, *run.test_data)
    )
    n_train = len(run.ytr)
    y_all = np.concatenate([run.ytr, run.yte])
    train_acc = float((logits[:n_train].argmax(1) == run.ytr).mean())
    test_acc = float((logits[n_train:].argmax(1) == run.yte).mean())
    precision = C.matmul_precision_name(VERIFY_PRECISION)
    f64 = C.float64_check(
        params, np.concatenate([run.xtr, run.xte]), y_all, logits, float(ce32), precision
    )
    f64.update(train_accuracy=train_acc, test_accuracy=test_acc)
    # float32: the documented limit; lower: each logit's a-priori bound (`C.float64_check`)
    limit = "<" if precision == "float32" else "≤ a-priori bound"
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
            "ok": not any(leaf.is_deleted() for leaf in (*run.train_data, *run.fit_data)),
            "detail": "training data buffers still alive",
        },
        "float64_logits": {
            "ok": f64["logits_ok"],
            "detail": f"max |logit − float64| = {f64['max_logit_error']:.2e} "
            f"({limit} {f64['logit_limit']:.1e}, {precision} matmuls)",
        },
        "float64_cross_entropy": {
            "ok": f64["cross_entropy_ok"],
            "detail": f"|CE − float64 CE| = {f64['cross_entropy_error']:.2e} "
            f"(< {f64['cross_entropy_limit']:.1e}, {precision} matmuls)",
        },
        "float64_accuracy": {
            "ok": f64["accuracy_ok"],
            "detail": f"float32 {f64['accuracy_float32']:.4f} vs float64 "
            f"{f64['accuracy_float64']:.4f} ({precision} matmuls)",
        },
    }
    if not cfg.dp:
        checks["accuracy"] = {
            "ok": train_acc > 0.95 and test_acc > 0.95,
            "detail": f"train {train_acc:.3f}, test {test_acc:.3f} (> 0.95)",
        }
    return (
        checks,
        f64,
        _describe_examples(run.xtr, run.ytr, logits[:n_train], hard_idx, hard_norms),
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
    outputs = _plots(run, hard, test_acc) if run.out is not None and cfg.plots else {}
    if run.out is not None:
        outputs["metrics"] = str(run.out.path / "metrics.jsonl")
        for name in cfg.log:  # the --log writers' directories
            outputs[name] = str(run.out.path / LOG_DIRS[name])
    total_steps = cfg.epochs * run.steps_per_epoch
    device = jax.devices()[0]
    summary: dict[str, Any] = {
        "schema": 1,
        "job": "spiral",
        "backend": device.platform,
        "device_kind": device.device_kind,
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
        summary["dp"] = C.dp_report(cfg, len(run.fit_data[1]), total_steps)
        if run.audit is not None:
            summary["dp"].update(run.audit)
    return C.jsonable(summary)


def _plots(run: _Run, hard: list[dict[str, Any]], test_acc: float) -> dict[str, str]:
    from jaxwise.cli._plotting import plot_decision_boundary, plot_training

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


def _verification(
    params: Any,
    xtr: jax.Array,
    ytr: jax.Array,
    xte: jax.Array,
    yte: jax.Array,
    *,
    precision: str,
) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """What ``verify`` needs from the trained model, as ONE program (compiled in the background).

    Returns the float32 logits of the training then the test rows ``(N, 3)`` and their mean
    cross-entropy, with matrix products at ``precision`` (`VERIFY_PRECISION`), and the
    indices ``(5,)`` and gradient norms ``(5,)`` of the hardest training examples.
    """
    x = jnp.concatenate([xtr, xte])
    if precision == "bfloat16":  # one bfloat16 pass, explicitly (XLA:CPU ignores precision)
        logits = _bfloat16_logits(params, x)
    else:
        with jax.default_matmul_precision(precision):
            logits = mlp_apply(params, x)
    ce = numerics.cross_entropy(logits, jnp.concatenate([ytr, yte]))
    idx, norms = _hardest(params, xtr, ytr)
    return logits, ce, idx, norms


def _bfloat16_logits(params: Any, x: jax.Array) -> jax.Array:
    """The MLP's ``(N, C)`` logits with bfloat16 matmul operands, float32 accumulation."""
    n = len(params)
    for i in range(n):
        layer = params[f"dense_{i}"]
        x = (
            jnp.dot(
                x.astype(jnp.bfloat16),
                layer["w"].astype(jnp.bfloat16),
                preferred_element_type=jnp.float32,
            )
            + layer["b"]
        )
        if i < n - 1:
            x = jax.nn.relu(x)
    return x


def _hardest(params: Any, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The 5 training examples with the largest gradient norms (chunked per-example gradients)."""
    return hardest_examples(C.per_example_loss(), params, (x, y), k=5, chunk_size=256)


def _describe_examples(
    x: np.ndarray, y: np.ndarray, logits: np.ndarray, idx: np.ndarray, norms: np.ndarray
) -> list[dict[str, Any]]:
    """The hard examples for the report; probabilities from the float32 logits, in float64."""
    shifted = logits[idx].astype(np.float64)
    shifted -= shifted.max(1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(1, keepdims=True)
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

"""The ``jaxwise`` subcommands: each turns parsed arguments into a job and prints its summary.

Each command imports what it needs when it runs (``lint`` and ``bench`` never import JAX or
NumPy; ``--help`` and ``--version`` import neither, nor the linter).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from jaxwise._errors import UserError

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "cmd_bench",
    "cmd_doctor",
    "cmd_label_errors",
    "cmd_lint",
    "cmd_predict",
    "cmd_report",
    "cmd_spiral",
    "cmd_train",
    "cmd_watch",
]


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def _emit(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(summary, allow_nan=False))
        return
    from jaxwise.cli._render import render

    render(summary)


# --------------------------------------------------------------------------
# Commands (each imports what it needs)
# --------------------------------------------------------------------------


def _precheck(args: argparse.Namespace) -> None:
    """The training options, checked before JAX is imported (a bad option is refused at once)."""
    from types import SimpleNamespace

    from jaxwise.cli._options import check_training_options

    check_training_options(SimpleNamespace(**{"lr": 1e-2, "hidden": (64, 64), **vars(args)}))


def _require_extras(args: argparse.Namespace, *, plots: bool, checkpoints: bool) -> None:
    """Refuse at once (exit 2, one line) a run that would need a missing extra later on."""
    from jaxwise._shared._extras import require

    command = f"jaxwise {args.command}"
    if not args.json or not getattr(args, "no_progress", True):
        require("rich", extra="cli", feature=f"the terminal output of {command}")
    if plots:
        require("matplotlib", extra="cli", feature=f"the plots of {command} (or --no-plots)")
    if checkpoints:
        require("orbax.checkpoint", extra="checkpoint", feature=f"the checkpoints of {command}")
    if getattr(args, "dp", False):
        require("dp_accounting", extra="privacy", feature=f"{command} --dp")
    for name, module in (("tensorboard", "tensorboardX"), ("mlflow", "mlflow")):
        if name in getattr(args, "log", ()):
            require(module, extra=name, feature=f"{command} --log {name}")


def _dp_options(args: argparse.Namespace) -> dict[str, Any]:
    """``--mechanism``, ``--bands``, ``--adaptive-clip`` (``None`` where not given)."""
    keys = ("mechanism", "bands", "adaptive_clip")
    return {k: getattr(args, k, None) for k in keys}


def _cache_options(args: argparse.Namespace) -> dict[str, Any]:
    return {"cache": not args.no_cache}


def cmd_spiral(args: argparse.Namespace) -> int:
    _precheck(args)
    _require_extras(args, plots=bool(args.out) and not args.no_plots, checkpoints=False)
    from jaxwise.cli._jobs import SpiralConfig, run_spiral

    cfg = SpiralConfig(
        epochs=args.epochs,
        batch_size=args.batch_size or 128,
        noise=args.noise,
        seed=args.seed,
        out=args.out,
        dp=args.dp,
        clip_norm=args.clip_norm,
        noise_multiplier=args.noise_multiplier,
        audit=args.audit,
        **_dp_options(args),
        progress=not args.no_progress,
        plots=not args.no_plots,
        log=tuple(n for n in args.log if n != "jsonl"),
        **_cache_options(args),
    )
    summary = run_spiral(cfg)
    _emit(args, summary)
    return 0 if summary["ok"] else 1


def _tabular_config(args: argparse.Namespace, out: str) -> Any:
    from jaxwise.cli._jobs import TabularConfig

    return TabularConfig(
        path=args.csv,
        label=args.label,
        hidden=args.hidden,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        val_fraction=args.val_fraction,
        seed=args.seed,
        out=out,
        drop_na=args.drop_na,
        resume=getattr(args, "resume", False),
        force=getattr(args, "force", False) if args.command == "train" else False,
        allow_different_data=getattr(args, "allow_different_data", False),
        stop_after=getattr(args, "stop_after", None),
        dp=args.dp,
        clip_norm=args.clip_norm,
        noise_multiplier=args.noise_multiplier,
        audit=getattr(args, "audit", None),
        **_dp_options(args),
        progress=not args.no_progress,
        plots=not getattr(args, "no_plots", False),
        early_stopping=getattr(args, "early_stopping", None),
        log=tuple(n for n in getattr(args, "log", ()) if n != "jsonl"),
        checkpoint_every=getattr(args, "checkpoint_every", 1),
        **_cache_options(args),
    )


def cmd_train(args: argparse.Namespace) -> int:
    _precheck(args)
    _require_extras(args, plots=not args.no_plots, checkpoints=True)
    from jaxwise.cli._jobs import run_train

    _emit(args, run_train(_tabular_config(args, args.out)))
    return 0


def cmd_label_errors(args: argparse.Namespace) -> int:
    _precheck(args)
    _require_extras(
        args, plots=bool(args.run_dir) and not args.no_plots, checkpoints=bool(args.run_dir)
    )
    from jaxwise.cli._jobs import run_label_errors

    _emit(
        args,
        run_label_errors(
            _tabular_config(args, args.run_dir),
            args.top,
            args.out,
            method=args.method,
            force=args.force,
            folds=args.folds,
        ),
    )
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    _require_extras(args, plots=False, checkpoints=True)
    from jaxwise.cli._jobs import PredictConfig, run_predict

    cfg = PredictConfig(
        run_dir=args.run_dir,
        path=args.csv,
        out=args.out,
        force=args.force,
        drop_na=args.drop_na,
        **_cache_options(args),
    )
    _emit(args, run_predict(cfg))
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    _require_extras(args, plots=False, checkpoints=False)
    from jaxwise.cli import _doctor as doctor

    env = doctor.environment()
    failed = doctor.failure(env)
    text = doctor.render(env, doctor.run_checks(failed=failed), as_json=args.json)
    print(text, end="" if not args.json else "\n")
    return 1 if failed is not None else 0  # the report is printed either way


def cmd_lint(args: argparse.Namespace) -> int:
    from jaxwise.lint import lint_paths

    try:
        findings, errors, count = lint_paths(args.paths, select=args.select, ignore=args.ignore)
    except FileNotFoundError as err:
        raise UserError(str(err)) from None
    for error in errors:
        print(error.format(), file=sys.stderr)
    if args.format == "json":
        print(
            json.dumps(
                {
                    "files": count,
                    "findings": [f.to_dict() for f in findings],
                    "errors": [{"path": e.path, "message": e.message} for e in errors],
                }
            )
        )
    else:
        for finding in findings:
            print(finding.format())
        summary = f"{len(findings)} finding(s) in {count} file(s)" + (
            f", {len(errors)} unreadable" if errors else ""
        )
        print(summary, file=sys.stderr)
    return 1 if findings or errors else 0


def cmd_watch(args: argparse.Namespace) -> int:
    import numpy as np

    state = None if "jax" in sys.modules else np.random.get_state()  # before jax draws from it
    from jaxwise.watch import run_script

    return run_script(
        args.script,
        args.args,
        json_path=args.json,
        html_path=args.html,
        nans=args.nans,
        transfers=args.transfers,
        fail_on=args.fail_on,
        warmup=args.warmup,
        numpy_state=state,
    )


def cmd_report(args: argparse.Namespace) -> int:
    from jaxwise.report import write_run_report

    path = write_run_report(args.run_dir, args.out)
    if args.json:
        print(json.dumps({"report": str(path)}))
    else:
        print(f"jaxwise report: wrote {path}", file=sys.stderr)
    return 0


def _benchmarks_dir(explicit: str | None) -> Path:
    """The benchmark scripts: ``--benchmarks DIR``, this checkout's, or ./benchmarks."""
    from pathlib import Path

    if explicit:
        candidates = [Path(explicit)]
    else:
        package = Path(__file__).resolve().parents[1]  # jaxwise/ (this is jaxwise/cli/...)
        candidates = [package.parents[1] / "benchmarks", Path.cwd() / "benchmarks"]
    for candidate in candidates:
        if (candidate / "bench_all.py").is_file():
            return candidate.resolve()
    if explicit:
        raise UserError(
            f"--benchmarks {explicit}: no bench_all.py there (give the benchmarks/ folder of a "
            "jaxwise source checkout)"
        )
    raise UserError(
        "the benchmarks are not installed with the package (they live in a source checkout): "
        "run `jaxwise bench` inside a jaxwise checkout, or pass --benchmarks CHECKOUT/benchmarks"
    )


def cmd_bench(args: argparse.Namespace) -> int:
    import subprocess
    from pathlib import Path

    bench = _benchmarks_dir(args.benchmarks)
    out = Path(args.out).resolve() if args.out else bench
    package = Path(__file__).resolve().parents[1]  # the jaxwise package, not its cli/
    if out == package or package in out.parents:
        raise UserError(
            f"--out {out}: inside the installed jaxwise package; choose another directory"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserError(f"--out {out}: not writable ({err.strerror or err})") from None
    extra = (["--only", *args.only] if args.only else []) + (["--quick"] if args.quick else [])
    return subprocess.run(
        [sys.executable, str(bench / "bench_all.py"), *extra, "--out", str(out)]
    ).returncode

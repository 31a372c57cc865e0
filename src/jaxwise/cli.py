"""The ``jaxwise`` command line.

Subcommands: ``spiral`` (the main job), ``train CSV --label COL``,
``label-errors CSV --label COL --top K --out FILE``, ``lint PATH...``,
``doctor``, ``bench``.
``--json`` prints one JSON object on stdout (progress bars go to stderr).
User errors print one line ``jaxwise: error: …`` on stderr and exit with
code 2; a run whose built-in checks fail exits with code 1.

Example:
    >>> build_parser().parse_args(["spiral", "--epochs", "3"]).epochs
    3
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import jaxwise

__all__ = ["build_parser", "main"]


def _hidden(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated layer widths like 64,64, got {text!r}") from None
    if not sizes or any(s < 1 for s in sizes):
        raise argparse.ArgumentTypeError(f"expected positive layer widths like 64,64, got {text!r}")
    return sizes


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, highlight=False)


def _print_checks(console: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title="guarantees checked at run time")
    table.add_column("check")
    table.add_column("result")
    table.add_column("detail")
    for name, check in summary["checks"].items():
        table.add_row(name, "[green]PASS[/]" if check["ok"] else "[red]FAIL[/]", check["detail"])
    console.print(table)


def _print_summary(console: Any, summary: dict[str, Any]) -> None:
    from rich.table import Table

    table = Table(title=f"jaxwise {summary['job']}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [
        ("train accuracy", f"{summary['train_accuracy']:.4f}"),
        ("test accuracy" if summary["job"] == "spiral" else "validation accuracy", f"{summary['test_accuracy']:.4f}"),
        ("final loss", f"{summary['final_loss']:.5f}" if summary.get("final_loss") is not None else "—"),
        ("compilations of the training program", str(summary["compiles"])),
        ("time (total / training / compiling)", "{total_s:.1f} s / {train_s:.1f} s / {compile_s:.1f} s".format(
            **summary["timings"])),
    ]
    if "dp" in summary:
        dp = summary["dp"]
        rows.append(("privacy", f"ε = {dp['epsilon']:.2f} at δ = {dp['delta']:g} (σ = {dp['noise_multiplier']}, "
                                f"C = {dp['clip_norm']}, q = {dp['sample_rate']:.4f}, {dp['steps']} steps)"))
    for key, path in summary.get("outputs", {}).items():
        rows.append((key.replace("_", " "), str(path)))
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def _print_examples(console: Any, title: str, rows: list[dict[str, Any]], columns: list[str]) -> None:
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col)
    for row in rows:
        cells = []
        for col in columns:
            value = row[col]
            if isinstance(value, float):
                cells.append(f"{value:.4g}")
            elif isinstance(value, list):
                cells.append("(" + ", ".join(f"{v:.3f}" for v in value) + ")")
            else:
                cells.append(str(value))
        table.add_row(*cells)
    console.print(table)


def _emit(args: argparse.Namespace, summary: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(summary))
        return
    console = _console()
    _print_summary(console, summary)
    if "checks" in summary:
        _print_checks(console, summary)
    if summary.get("hard_examples"):
        _print_examples(console, "hardest training examples (largest per-example gradient norm)",
                        summary["hard_examples"], ["index", "x", "true", "predicted", "p_true", "grad_norm", "loss"])
    if summary.get("confusion_matrix") is not None:
        from rich.table import Table

        table = Table(title="validation confusion matrix (rows: true, columns: predicted)")
        table.add_column("")
        for c in summary["classes"]:
            table.add_column(str(c))
        for c, row in zip(summary["classes"], summary["confusion_matrix"]):
            table.add_row(str(c), *map(str, row))
        console.print(table)
    if summary.get("suspects"):
        _print_examples(console, "suspected label errors", summary["suspects"],
                        ["row", "given_label", "predicted_label", "p_given", "grad_norm"])


def _cmd_spiral(args: argparse.Namespace) -> int:
    from jaxwise.jobs import SpiralConfig, run_spiral

    cfg = SpiralConfig(epochs=args.epochs, batch_size=args.batch_size, noise=args.noise, seed=args.seed,
                       out=args.out, dp=args.dp, clip_norm=args.clip_norm, noise_multiplier=args.noise_multiplier,
                       progress=not args.no_progress)
    summary = run_spiral(cfg)
    _emit(args, summary)
    return 0 if summary["ok"] else 1


def _tabular_config(args: argparse.Namespace, out: str) -> Any:
    from jaxwise.jobs import TabularConfig

    return TabularConfig(path=args.csv, label=args.label, hidden=args.hidden, epochs=args.epochs,
                         batch_size=args.batch_size, lr=args.lr, val_fraction=args.val_fraction, seed=args.seed,
                         out=out, drop_na=args.drop_na, resume=getattr(args, "resume", False),
                         stop_after=getattr(args, "stop_after", None), dp=args.dp, clip_norm=args.clip_norm,
                         noise_multiplier=args.noise_multiplier, progress=not args.no_progress)


def _cmd_train(args: argparse.Namespace) -> int:
    from jaxwise.jobs import run_train

    _emit(args, run_train(_tabular_config(args, args.out)))
    return 0


def _cmd_label_errors(args: argparse.Namespace) -> int:
    from jaxwise.jobs import run_label_errors

    _emit(args, run_label_errors(_tabular_config(args, args.run_dir), args.top, args.out))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from jaxwise import doctor

    print(doctor.report(as_json=args.json), end="" if not args.json else "\n")
    return 0


def _codes(text: str) -> list[str]:
    from jaxwise.lint import RULES

    codes = [c.strip().upper() for c in text.split(",") if c.strip()]
    unknown = [c for c in codes if c not in RULES]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown rule code(s) {', '.join(unknown)}; known: {', '.join(RULES)}")
    return codes


def _cmd_lint(args: argparse.Namespace) -> int:
    from jaxwise.jobs import UserError
    from jaxwise.lint import lint_paths

    try:
        findings, errors, count = lint_paths(args.paths, select=args.select, ignore=args.ignore)
    except FileNotFoundError as err:
        raise UserError(str(err)) from err
    for error in errors:
        print(error.format(), file=sys.stderr)
    if args.format == "json":
        print(json.dumps({"files": count, "findings": [f.to_dict() for f in findings],
                          "errors": [{"path": e.path, "message": e.message} for e in errors]}))
    else:
        for finding in findings:
            print(finding.format())
        summary = f"{len(findings)} finding(s) in {count} file(s)" + (f", {len(errors)} unreadable" if errors else "")
        print(summary, file=sys.stderr)
    return 1 if findings or errors else 0


def _benchmarks_dir() -> Path:
    from jaxwise.jobs import UserError

    for candidate in (Path(jaxwise.__file__).resolve().parents[2] / "benchmarks", Path.cwd() / "benchmarks"):
        if (candidate / "bench_all.py").exists():
            return candidate
    raise UserError("benchmarks/ not found: run `jaxwise bench` from a jaxwise source checkout")


def _cmd_bench(args: argparse.Namespace) -> int:
    script = _benchmarks_dir() / "bench_all.py"
    extra = (["--only", *args.only] if args.only else []) + (["--quick"] if args.quick else [])
    return subprocess.run([sys.executable, str(script), *extra]).returncode


def _add_training_options(p: argparse.ArgumentParser, epochs: int) -> None:
    p.add_argument("--epochs", type=_positive_int, default=epochs, help=f"training epochs (default {epochs})")
    p.add_argument("--batch-size", type=_positive_int, default=128, help="mini-batch size (default 128)")
    p.add_argument("--seed", type=int, default=0, help="random seed for data, split and initialisation (default 0)")
    p.add_argument("--dp", action="store_true", help="train with DP-SGD (Poisson sampling, clipping, noise)")
    p.add_argument("--clip-norm", type=float, default=1.0, help="DP-SGD per-example clip norm C (default 1.0)")
    p.add_argument("--noise-multiplier", type=float, default=1.1, help="DP-SGD noise multiplier σ (default 1.1)")
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_csv_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("csv", metavar="DATA.csv", help="CSV with a header row, numeric features and a label column")
    p.add_argument("--label", required=True, help="name of the label column (integers or strings)")
    p.add_argument("--hidden", type=_hidden, default=(64, 64), help="hidden layer widths (default 64,64)")
    p.add_argument("--lr", type=float, default=1e-2, help="peak learning rate (default 1e-2)")
    p.add_argument("--val-fraction", type=float, default=0.2, help="validation split (default 0.2)")
    p.add_argument("--drop-na", action="store_true", help="drop rows with missing values instead of failing")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="jaxwise", description="JAX training that compiles once, stays finite and is verified in float64."
    )
    parser.add_argument("--version", action="version", version=f"jaxwise {jaxwise.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    spiral = sub.add_parser("spiral", help="the main job: train the spiral classifier with every check in place")
    _add_training_options(spiral, epochs=150)
    spiral.add_argument("--noise", type=float, default=0.15, help="angular noise σ of the spiral (default 0.15)")
    spiral.add_argument("--out", default="runs/spiral", help="directory for the PNG plots (default runs/spiral)")
    spiral.set_defaults(run=_cmd_spiral)

    train = sub.add_parser("train", help="train an MLP classifier on your CSV")
    _add_csv_options(train)
    _add_training_options(train, epochs=50)
    train.add_argument("--out", default="runs/train", help="directory for checkpoint and plots (default runs/train)")
    train.add_argument("--resume", action="store_true", help="continue the run checkpointed in --out")
    train.add_argument("--stop-after", type=_positive_int, default=None, metavar="EPOCHS",
                       help="stop (with a checkpoint) after this many epochs; continue later with --resume")
    train.set_defaults(run=_cmd_train)

    errors = sub.add_parser("label-errors", help="train, then list the rows most likely mislabeled")
    _add_csv_options(errors)
    _add_training_options(errors, epochs=50)
    errors.add_argument("--top", type=_positive_int, default=20, help="how many suspects to report (default 20)")
    errors.add_argument("--out", required=True, metavar="SUSPECTS.csv", help="CSV file to write the suspects to")
    errors.add_argument("--run-dir", default="runs/label-errors",
                        help="directory for the checkpoint and plots (default runs/label-errors)")
    errors.set_defaults(run=_cmd_label_errors)

    lint = sub.add_parser("lint", help="find JAX pitfalls in source code (static analysis, nothing is run)")
    lint.add_argument("paths", nargs="+", metavar="PATH", help="files or directories (recursing into *.py)")
    lint.add_argument("--format", choices=("text", "json"), default="text", help="output format (default text)")
    lint.add_argument("--select", type=_codes, default=None, help="only these rules, e.g. JW001,JW003")
    lint.add_argument("--ignore", type=_codes, default=None, help="skip these rules, e.g. JW004")
    lint.set_defaults(run=_cmd_lint)

    doctor = sub.add_parser("doctor", help="print versions and devices; check known JAX pitfalls live")
    doctor.add_argument("--json", action="store_true", help="print one JSON object")
    doctor.set_defaults(run=_cmd_doctor)

    bench = sub.add_parser("bench", help="run benchmarks/ and write benchmarks/RESULTS.md")
    bench.add_argument("--only", nargs="*", help="benchmark names, e.g. compile_budget")
    bench.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    bench.set_defaults(run=_cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxwise`` console script; returns the exit code."""
    from jaxwise.jobs import UserError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except UserError as err:
        print(f"jaxwise: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("jaxwise: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

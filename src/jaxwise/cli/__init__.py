"""The ``jaxwise`` command line.

Subcommands: ``spiral`` (the main job), ``train CSV --label COL``,
``predict RUN_DIR DATA.csv --out PREDICTIONS.csv``,
``label-errors CSV --label COL --top K --out FILE``, ``lint PATH...``,
``watch [options] SCRIPT [ARGS...]``, ``report RUN_DIR [--out FILE]``, ``doctor``, ``bench``.
``--json`` prints one strict JSON object on stdout (progress bars go to stderr).

Exit codes: 0 success; 1 a run whose built-in checks fail or that trained nothing (one line),
or an unexpected error (one line, ``--debug`` shows the traceback); 2 a user error (bad
option, bad file, existing output, a run directory in use, a full disk): one line
``jaxwise: error: …`` on stderr; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM) — both
after the checkpoint being written is complete and the locks are released.

Pillars are imported lazily, per subcommand: ``jaxwise --help``, ``--version`` and
``jaxwise lint`` never import JAX.

Examples:
    >>> build_parser().parse_args(["spiral", "--epochs", "3"]).epochs
    3
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from jaxwise._errors import JaxwiseError
from jaxwise.cli import _commands as commands
from jaxwise.cli._needs import LOGS as _LOGS
from jaxwise.cli._needs import fail_conditions as _fail_on
from jaxwise.cli._needs import hidden_sizes as _hidden
from jaxwise.cli._needs import log_writers as _logs
from jaxwise.cli._needs import positive_int as _positive_int
from jaxwise.cli._needs import rule_codes as _codes
from jaxwise.cli._needs import without_effect as _without_effect

__all__ = ["build_parser", "main"]


# --------------------------------------------------------------------------
# The parser
# --------------------------------------------------------------------------


def _add_common(
    p: argparse.ArgumentParser, json_help: str = "print one JSON object on stdout"
) -> None:
    p.add_argument("--json", action="store_true", help=json_help)
    p.add_argument(
        "--debug",
        action="store_true",
        default=argparse.SUPPRESS,
        help="show the full traceback of an unexpected error",
    )


def _add_training_options(p: argparse.ArgumentParser, epochs: int, batch_help: str) -> None:
    p.add_argument(
        "--epochs", type=_positive_int, default=epochs, help=f"training epochs (default {epochs})"
    )
    p.add_argument("--batch-size", type=_positive_int, default=None, help=batch_help)
    p.add_argument("--seed", type=int, default=0, help="random seed in [0, 2^32) (default 0)")
    p.add_argument(
        "--dp", action="store_true", help="train with DP-SGD (Poisson sampling, clipping, noise)"
    )
    p.add_argument(
        "--clip-norm",
        type=float,
        default=1.0,
        help="DP-SGD per-example clip norm C > 0 (default 1.0)",
    )
    p.add_argument(
        "--noise-multiplier",
        type=float,
        default=1.1,
        help="DP-SGD noise multiplier σ >= 0 (default 1.1)",
    )
    _add_dp_mechanism(p)
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--no-cache",
        action="store_true",
        help="no persistent compilation cache (default: on, in $XDG_CACHE_HOME/jaxwise)",
    )
    _add_common(p)


def _add_dp_mechanism(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--mechanism",
        choices=("dpsgd", "bandmf", "blt", "auto"),
        default=None,
        help="with --dp: the noise: dpsgd (independent, default), bandmf (banded matrix "
        "factorization, cyclic Poisson sampling), blt (2 decaying buffers) or auto (the lowest "
        "expected error at the ε that --noise-multiplier gives DP-SGD)",
    )
    p.add_argument(
        "--bands",
        type=int,
        default=None,
        metavar="B",
        help="with --mechanism bandmf: the bands (memory (B-1)·|params|; default: chosen)",
    )
    p.add_argument(
        "--adaptive-clip",
        type=float,
        nargs="?",
        const=0.5,
        default=None,
        metavar="Q",
        help="with --dp: the clip norm tracks the Q-quantile of the gradient norms (default "
        "Q 0.5), starting at --clip-norm; its noised count is in ε",
    )


def _add_csv_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "csv", metavar="DATA.csv", help="CSV with a header row, numeric features and a label column"
    )
    p.add_argument("--label", required=True, help="name of the label column (integers or strings)")
    p.add_argument(
        "--hidden", type=_hidden, default=(64, 64), help="hidden layer widths (default 64,64)"
    )
    p.add_argument(
        "--lr", type=float, default=1e-2, help="peak learning rate in (0, 10] (default 1e-2)"
    )
    p.add_argument(
        "--val-fraction", type=float, default=0.2, help="validation split in (0, 0.9) (default 0.2)"
    )
    p.add_argument(
        "--drop-na", action="store_true", help="drop rows with missing values instead of failing"
    )
    _add_training_options(
        p, epochs=50, batch_help="mini-batch size (default min(128, training rows))"
    )


def _add_log(p: argparse.ArgumentParser, where: str) -> None:
    p.add_argument(
        "--log",
        type=_logs,
        default=("jsonl",),
        metavar="WRITERS",
        help=f"where each epoch's metrics go, comma-separated among {','.join(_LOGS)}: "
        f"{where}/metrics.jsonl (always), {where}/tensorboard (`tensorboard --logdir`; the "
        f"tensorboard extra), {where}/mlruns (`mlflow ui`; the mlflow extra) (default jsonl)",
    )


def _add_spiral(sub: Any) -> None:
    spiral = sub.add_parser(
        "spiral", help="the main job: train the spiral classifier with every check in place"
    )
    _add_training_options(spiral, epochs=150, batch_help="mini-batch size (default 128)")
    spiral.add_argument(
        "--noise", type=float, default=0.15, help="angular noise σ of the spiral (default 0.15)"
    )
    spiral.add_argument(
        "--out", default="runs/spiral", help="directory for the PNG plots (default runs/spiral)"
    )
    spiral.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _add_log(spiral, "OUT")
    _add_audit(spiral)
    spiral.set_defaults(run=commands.cmd_spiral)


def _add_audit(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--audit",
        type=_positive_int,
        default=None,
        metavar="M",
        help="with --dp: audit the run with M canaries (one-run auditing, Steinke et al. 2023) "
        "and report the ε lower bound next to the theoretical ε",
    )


def _add_train(sub: Any) -> None:
    train = sub.add_parser("train", help="train an MLP classifier on your CSV")
    _add_csv_options(train)
    train.add_argument(
        "--out",
        default="runs/train",
        help="directory for checkpoint, metrics.jsonl and plots (default runs/train)",
    )
    train.add_argument(
        "--resume", action="store_true", help="continue the run checkpointed in --out"
    )
    train.add_argument(
        "--force",
        action="store_true",
        help="start the run in --out afresh, deleting what an earlier run wrote there "
        "(checkpoints, metrics, plots; other files are kept)",
    )
    train.add_argument(
        "--allow-different-data",
        action="store_true",
        help="--resume even if the training rows differ from the checkpointed run's",
    )
    train.add_argument(
        "--stop-after",
        type=_positive_int,
        default=None,
        metavar="EPOCHS",
        help="stop (with a checkpoint) after this many epochs; continue later with --resume",
    )
    train.add_argument(
        "--early-stopping",
        type=_positive_int,
        default=None,
        metavar="PATIENCE",
        help="stop after PATIENCE epochs without a lower validation loss; keep the best",
    )
    train.add_argument(
        "--checkpoint-every",
        type=_positive_int,
        default=1,
        metavar="EPOCHS",
        help="save a checkpoint every EPOCHS epochs, in the background, and at the end "
        "(default 1: a killed run loses at most the epoch in progress)",
    )
    _add_log(train, "OUT")
    train.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    _add_audit(train)
    train.set_defaults(run=commands.cmd_train)


def _add_label_errors(sub: Any) -> None:
    errors = sub.add_parser("label-errors", help="train, then list the rows most likely mislabeled")
    _add_csv_options(errors)
    errors.add_argument(
        "--top",
        type=_positive_int,
        default=None,
        help="how many suspects to report (default: with --method oof, confident learning's "
        "estimate of how many labels are wrong; with gradnorm, 20)",
    )
    errors.add_argument(
        "--out", required=True, metavar="SUSPECTS.csv", help="CSV file to write the suspects to"
    )
    errors.add_argument(
        "--force",
        action="store_true",
        help="replace --out if it exists, and start --run-dir afresh if it holds another run "
        "(deleting what that run wrote there)",
    )
    errors.add_argument(
        "--method",
        choices=("oof", "gradnorm"),
        default="oof",
        help="oof: out-of-fold probabilities + confident learning (default); "
        "gradnorm: per-example gradient norms of one trained model",
    )
    errors.add_argument(
        "--folds", type=_positive_int, default=5, help="folds for --method oof (default 5)"
    )
    errors.add_argument(
        "--run-dir",
        default="runs/label-errors",
        help="directory for metrics and plots; re-runs may reuse it (default runs/label-errors)",
    )
    _add_log(errors, "RUN_DIR")
    errors.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    errors.set_defaults(run=commands.cmd_label_errors)


def _add_predict(sub: Any) -> None:
    predict = sub.add_parser("predict", help="apply a `jaxwise train` run to new rows")
    predict.add_argument(
        "run_dir", metavar="RUN_DIR", help="the --out directory of a `jaxwise train` run"
    )
    predict.add_argument(
        "csv", metavar="DATA.csv", help="rows with the run's feature columns (label optional)"
    )
    predict.add_argument(
        "--out", required=True, metavar="PREDICTIONS.csv", help="CSV file for the predictions"
    )
    predict.add_argument("--force", action="store_true", help="replace --out if it exists")
    predict.add_argument(
        "--drop-na", action="store_true", help="drop rows with missing values instead of failing"
    )
    predict.add_argument(
        "--no-cache", action="store_true", help="do not use the persistent compilation cache"
    )
    _add_common(predict)
    predict.set_defaults(run=commands.cmd_predict)


def _add_tools(sub: Any) -> None:
    lint = sub.add_parser(
        "lint", help="find JAX pitfalls in source code (static analysis, nothing is run)"
    )
    lint.add_argument(
        "paths", nargs="+", metavar="PATH", help="files or directories (recursing into *.py)"
    )
    lint.add_argument(
        "--format", choices=("text", "json"), default="text", help="output format (default text)"
    )
    lint.add_argument(
        "--select", type=_codes, default=None, help="only these rules, e.g. JW001,JW003"
    )
    lint.add_argument("--ignore", type=_codes, default=None, help="skip these rules, e.g. JW004")
    lint.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    lint.set_defaults(run=commands.cmd_lint)

    doctor = sub.add_parser(
        "doctor", help="print versions and devices; check known JAX pitfalls live"
    )
    _add_common(doctor, json_help="print one JSON object")
    doctor.set_defaults(run=commands.cmd_doctor)

    bench = sub.add_parser(
        "bench", help="run the benchmarks of a source checkout and write RESULTS.md"
    )
    bench.add_argument("--only", nargs="*", help="benchmark names, e.g. compile_budget")
    bench.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    bench.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="directory for RESULTS.md and results/ (default: the checkout's benchmarks/)",
    )
    bench.add_argument(
        "--benchmarks", default=None, metavar="DIR", help="a checkout's benchmarks/ folder"
    )
    bench.add_argument(
        "--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
    )
    bench.set_defaults(run=commands.cmd_bench)


def _add_watch(sub: Any) -> None:
    watch = sub.add_parser(
        "watch",
        help="run a JAX script unchanged and report recompiles, NaNs, donations, transfers",
        description="Run SCRIPT in-process, unchanged, and report per jitted function: calls, "
        "compiles and each recompile's cause; steady-state recompiles, NaNs (--nans), failed "
        "donations and host-to-device transfers (--transfers) are flagged. The report goes to "
        "stderr; the script's stdout is untouched.",
    )
    watch.add_argument("--json", metavar="FILE", default=None, help="also write the report as JSON")
    watch.add_argument(
        "--html",
        metavar="FILE",
        default=None,
        help="also write the report as one self-contained HTML page",
    )
    watch.add_argument(
        "--nans",
        nargs="?",
        const="stop",
        default=None,
        choices=("stop", "report"),
        help="locate the first NaN a jitted function produces; stop there (exit code 3, the "
        "default) or --nans=report to continue",
    )
    watch.add_argument(
        "--transfers",
        action="store_true",
        help="count host values (NumPy arrays, Python scalars) copied to the device per call site",
    )
    watch.add_argument(
        "--fail-on",
        type=_fail_on,
        default=(),
        metavar="LIST",
        help="exit with code 3 on any of recompile (steady-state), nan, donation",
    )
    watch.add_argument(
        "--warmup",
        type=_positive_int,
        default=2,
        metavar="N",
        help="compiles per function before a recompile counts as steady-state (default 2)",
    )
    watch.add_argument("script", metavar="SCRIPT", help="the Python script to run")
    watch.add_argument(
        "args", nargs=argparse.REMAINDER, metavar="ARGS", help="the script's arguments"
    )
    watch.set_defaults(run=commands.cmd_watch)


def _add_report(sub: Any) -> None:
    report = sub.add_parser(
        "report",
        help="write a run directory's report as one self-contained HTML page",
        description="Write RUN_DIR's report (curves, compile counts and times, guarantees, "
        "configuration, DP ε and audit, label issues, watch findings) as one HTML file: no "
        "script, nothing loaded from the network.",
    )
    report.add_argument(
        "run_dir", metavar="RUN_DIR", help="the --out (or --run-dir) directory of a jaxwise run"
    )
    report.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="the HTML file (default RUN_DIR/report.html; an earlier report there is replaced)",
    )
    _add_common(report, json_help='print {"report": PATH} as JSON on stdout')
    report.set_defaults(run=commands.cmd_report)


class _Version(argparse.Action):
    """``--version``, reading the installed version only when asked (``importlib.metadata``)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> NoReturn:
        from jaxwise._version import version

        print(f"jaxwise {version()}")
        parser.exit()


class _Parser(argparse.ArgumentParser):
    """argparse, with usage errors on one line (exit code 2) like every other jaxwise error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand.

    Returns:
        The ``argparse`` parser of the ``jaxwise`` command; each subcommand sets ``run``.
    """
    return _parser_and_commands()[0]


def _parser_and_commands() -> tuple[argparse.ArgumentParser, dict[str, Any]]:
    """The argument parser and its subcommands' parsers (by name)."""
    parser = _Parser(
        prog="jaxwise",
        description="JAX training that compiles once, stays finite and is verified in float64.",
    )
    parser.add_argument("--version", action=_Version, nargs=0, help="show the version and exit")
    parser.add_argument(
        "--debug", action="store_true", help="show the full traceback of an unexpected error"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_spiral(sub)
    _add_train(sub)
    _add_predict(sub)
    _add_label_errors(sub)
    _add_tools(sub)
    _add_watch(sub)
    _add_report(sub)
    return parser, sub.choices


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------


def _quiet() -> None:
    """No third-party log lines on the user's terminal (orbax and absl log at INFO/WARNING)."""
    import logging

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # JAX's compile-cache loggers by name (strings: importing jaxwise._shared._jax would load jax,
    # which a failing command must not; the names are kept equal to _jax.COMPILER_LOGGERS)
    compiler = ("jax._src.xla_bridge", "jax._src.compiler", "jax._src.compilation_cache")
    for name in ("absl", "orbax", *compiler):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from absl import logging as absl_logging  # type: ignore[import-not-found]
    except ImportError:
        return
    absl_logging.set_verbosity(absl_logging.ERROR)
    absl_logging.set_stderrthreshold("error")


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so that every ``finally`` runs (locks, files)."""


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text or type(err).__name__


def _disk_full(err: BaseException) -> str | None:
    from jaxwise._shared._disk import FULL

    if isinstance(err, OSError) and err.errno in FULL:
        where = f" writing {err.filename}" if err.filename else ""
        detail = err.strerror or ""
        detail = f" {detail.split('device', 1)[1].strip()}" if "device (" in detail else ""
        return (
            f"no space left on device{where}{detail}; free some space and run again "
            "(what was saved before is intact)"
        )
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``jaxwise`` console script.

    Args:
        argv: the arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 on success, 2 for a user error (one line on stderr), 1 for a run
            that produced no usable model, 130 on Ctrl-C.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if "watch" in argv:  # its bare --nans rewritten (cli._options imports NumPy: only then)
        from jaxwise.cli._options import explicit_nans

        argv = explicit_nans(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    unused = _without_effect(args, argv, _parser_and_commands)
    if unused is not None:
        print(f"jaxwise {args.command}: error: {unused} (see jaxwise {args.command} --help)",
              file=sys.stderr)  # fmt: skip
        return 2
    debug = bool(getattr(args, "debug", False))
    if args.command not in ("lint", "bench", "watch", "report"):
        _quiet()
    from jaxwise._shared._lock import set_command

    set_command(["jaxwise", *(sys.argv[1:] if argv is None else argv)])
    from jaxwise._shared._interrupt import raise_on_sigterm

    restore = raise_on_sigterm(_Terminated)
    try:
        return args.run(args)
    except _Terminated:
        print("jaxwise: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("jaxwise: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if debug:
            raise
        full = _disk_full(err)
        if full is not None:
            print(f"jaxwise: error: {full}", file=sys.stderr)
            return 2
        if isinstance(err, JaxwiseError):  # one line; exit 2 unless the class says otherwise
            print(f"jaxwise: error: {_one_line(err)}", file=sys.stderr)
            code = getattr(err, "exit_code", 2)
            return code if isinstance(code, int) else 2
        if isinstance(err, MemoryError):
            print(
                "jaxwise: error: out of memory; try a smaller --hidden or --batch-size",
                file=sys.stderr,
            )
            return 2
        if isinstance(err, OSError):
            where = f": {err.filename}" if err.filename else ""
            print(f"jaxwise: error: {err.strerror or _one_line(err)}{where}", file=sys.stderr)
            return 2
        print(
            f"jaxwise: error: unexpected {type(err).__name__}: {_one_line(err)[:300]} "
            "(run with --debug for the traceback)",
            file=sys.stderr,
        )
        return 1
    finally:
        if restore is not None:
            restore()

"""The ``jaxwise`` command line.

Subcommands: ``doctor`` (environment and live pitfall checks), ``bench``
(runs ``benchmarks/`` and writes ``benchmarks/RESULTS.md``). User errors
print one line ``jaxwise: error: …`` on stderr and exit with code 2.

Example:
    >>> build_parser().parse_args(["doctor", "--json"]).json
    True
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import jaxwise

__all__ = ["UserError", "build_parser", "main"]


class UserError(Exception):
    """A problem with the user's input or environment: reported in one line, exit code 2."""


def _cmd_doctor(args: argparse.Namespace) -> int:
    from jaxwise import doctor

    print(doctor.report(as_json=args.json), end="" if not args.json else "\n")
    return 0


def _benchmarks_dir() -> Path:
    for candidate in (Path(jaxwise.__file__).resolve().parents[2] / "benchmarks", Path.cwd() / "benchmarks"):
        if (candidate / "bench_all.py").exists():
            return candidate
    raise UserError("benchmarks/ not found: run `jaxwise bench` from a jaxwise source checkout")


def _cmd_bench(args: argparse.Namespace) -> int:
    import subprocess

    script = _benchmarks_dir() / "bench_all.py"
    extra = (["--only", *args.only] if args.only else []) + (["--quick"] if args.quick else [])
    return subprocess.run([sys.executable, str(script), *extra]).returncode


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = argparse.ArgumentParser(
        prog="jaxwise", description="JAX training that compiles once, stays finite and is verified in float64."
    )
    parser.add_argument("--version", action="version", version=f"jaxwise {jaxwise.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

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

"""Run every ``bench_*.py`` (each in its own process) and assemble ``RESULTS.md``.

Usage: ``python benchmarks/bench_all.py [--only NAME ...] [--quick]`` or
``jaxwise bench``. Sections already in ``results/`` from earlier runs are
kept for benchmarks that were not re-run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


def scripts() -> list[Path]:
    return sorted(p for p in HERE.glob("bench_*.py") if p.name != "bench_all.py")


def assemble() -> Path:
    """Write RESULTS.md from every section in results/ (ordered like the scripts)."""
    sections = []
    for script in scripts():
        section = RESULTS / f"{script.stem.removeprefix('bench_')}.md"
        if section.exists():
            sections.append(section.read_text().strip())
    header = (
        "# jaxwise benchmark results\n\n"
        "Ratios are ours / peer measured in the same process and run (warm-up excluded, "
        "median of several runs, `block_until_ready` on every timing). Absolute times are "
        "context only. Regenerate with `jaxwise bench` (or `python benchmarks/bench_all.py`).\n"
    )
    out = HERE / "RESULTS.md"
    out.write_text(header + "\n" + "\n\n".join(sections) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=None, help="benchmark names (e.g. compile_budget)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    args = parser.parse_args(argv)
    env = dict(os.environ, JAXWISE_BENCH_QUICK="1" if args.quick else os.environ.get("JAXWISE_BENCH_QUICK", "0"))
    env.setdefault("MPLBACKEND", "Agg")
    failures = []
    for script in scripts():
        name = script.stem.removeprefix("bench_")
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        proc = subprocess.run([sys.executable, str(script)], cwd=HERE, env=env)
        print(f"== {name}: {'ok' if proc.returncode == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s", flush=True)
        if proc.returncode != 0:
            failures.append(name)
    path = assemble()
    print(f"wrote {path}")
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Run every ``bench_*.py`` (each in its own process) and assemble ``RESULTS.md``.

Usage: ``python benchmarks/bench_all.py [--only NAME ...] [--quick] [--out DIR]`` or
``jaxwise bench``. Each script writes its section to ``DIR/results/<name>.md`` (the
environment variable ``JAXWISE_BENCH_RESULTS`` tells it where; default: ``results/`` next
to this file) and ``DIR/RESULTS.md`` is assembled from them. Sections already there from
earlier runs are kept for benchmarks that were not re-run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def scripts() -> list[Path]:
    return sorted(p for p in HERE.glob("bench_*.py") if p.name != "bench_all.py")


def assemble(out: Path = HERE) -> Path:
    """Write ``out/RESULTS.md`` from the sections in ``out/results/`` (in script order)."""
    sections = []
    for script in scripts():
        name = f"{script.stem.removeprefix('bench_')}.md"
        # a backend's own folder (results/<backend>/NAME.md) when the script writes one
        for section in [out / "results" / name, *sorted((out / "results").glob(f"*/{name}"))]:
            if section.exists():
                sections.append(section.read_text().strip())
    header = (
        "# jaxwise benchmark results\n\n"
        "Ratios are ours / peer measured in the same process and run (warm-up excluded, "
        "median of several runs, `block_until_ready` on every timing). Absolute times are "
        "context only. Regenerate with `jaxwise bench` (or `python benchmarks/bench_all.py`).\n"
    )
    path = out / "RESULTS.md"
    path.write_text(header + "\n" + "\n\n".join(sections) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--only", nargs="*", default=None, help="benchmark names (e.g. compile_budget)"
    )
    parser.add_argument("--quick", action="store_true", help="smaller sizes (smoke run)")
    parser.add_argument(
        "--out", type=Path, default=HERE, help="directory for RESULTS.md and results/"
    )
    args = parser.parse_args(argv)
    out = args.out.resolve()
    (out / "results").mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        JAXWISE_BENCH_QUICK="1" if args.quick else os.environ.get("JAXWISE_BENCH_QUICK", "0"),
        JAXWISE_BENCH_RESULTS=str(out / "results"),
    )
    env.setdefault("MPLBACKEND", "Agg")
    failures = []
    for script in scripts():
        name = script.stem.removeprefix("bench_")
        if args.only and name not in args.only:
            continue
        t0 = time.perf_counter()
        print(f"== {name}", flush=True)
        proc = subprocess.run([sys.executable, str(script)], cwd=HERE, env=env)
        print(
            f"== {name}: {'ok' if proc.returncode == 0 else 'FAILED'} "
            f"in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
        if proc.returncode != 0:
            failures.append(name)
    path = assemble(out)
    print(f"wrote {path}")
    if failures:
        print(f"failed: {', '.join(failures)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

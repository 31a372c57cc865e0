"""Shared helpers for the benchmark scripts: timing, environment, markdown sections.

Each ``bench_*.py`` measures ours and the peer in the same process, excludes
warm-up, blocks on every result, takes the median of several runs and writes
``results/<name>.md`` (a markdown section with a ratio table).
``bench_all.py`` runs them all and assembles ``RESULTS.md``.
"""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

RESULTS_DIR = Path(
    os.environ.get("JAXWISE_BENCH_RESULTS") or Path(__file__).resolve().parent / "results"
)
QUICK = os.environ.get("JAXWISE_BENCH_QUICK") == "1"


def block(out: Any) -> Any:
    """Block until every array in ``out`` is ready."""
    return jax.block_until_ready(out)


def median_time(
    fn: Callable[[], Any], *, repeat: int = 7, number: int = 1, warmup: int = 2
) -> float:
    """Median wall time of ``fn()`` in seconds (``number`` calls per sample), results blocked."""
    for _ in range(warmup):
        block(fn())
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            out = fn()
        block(out)
        samples.append((time.perf_counter() - t0) / number)
    return statistics.median(samples)


def interleaved_times(
    fns: Sequence[Callable[[], Any]], *, repeat: int = 15, number: int = 1
) -> list[float]:
    """Median times of several functions measured round-robin (fair under machine noise)."""
    for fn in fns:
        block(fn())
        block(fn())
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(number):
                out = fn()
            block(out)
            samples[i].append((time.perf_counter() - t0) / number)
    return [statistics.median(s) for s in samples]


def percentile(values: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


def environment_line() -> str:
    import jaxlib

    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"backend {jax.default_backend()} ({jax.devices()[0].device_kind}), "
        f"{datetime.date.today().isoformat()}"
    )


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds:.2f} s"


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def write_section(name: str, title: str, body: str) -> Path:
    """Write ``results/<name>.md`` with a heading, the environment and ``body``.

    ``name`` may name a sub-folder (``"tpu/optim_bandwidth"``). When the environment variable
    ``OUT`` is set, the section is also written to ``$OUT/<base name>.md``.
    """
    path = RESULTS_DIR / f"{name}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"## {title}\n\n_{environment_line()}_\n\n{body.strip()}\n")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"]).mkdir(parents=True, exist_ok=True)
        (Path(os.environ["OUT"]) / path.name).write_text(path.read_text())
    print(path.read_text())
    return path


def main_guard(run: Callable[[], None]) -> None:
    """Run a benchmark script's ``run`` with a readable failure."""
    try:
        run()
    except KeyboardInterrupt:
        sys.exit(130)

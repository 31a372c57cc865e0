"""`jaxwise report` on a long run: 10,000 steps x 200 metrics, time and page size.

Generates ``metrics.jsonl`` (a random walk per metric), then runs ``jaxwise report`` in a
fresh process (import included, as a user runs it) for the sources under test and, when
``BEFORE_SRC`` names another checkout's ``src``, for those too, alternating, median of
``REPEATS``. Target: <= 5 s and a page <= 10 MB.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

STEPS, METRICS = 10_000, 200
REPEATS = int(os.environ.get("REPEATS", "3"))
HERE = Path(__file__).resolve().parents[1] / "src"


def make_run(directory: Path) -> Path:
    values = np.cumsum(np.random.default_rng(0).normal(size=(STEPS, METRICS)), axis=0)
    names = [f"metric_{i:03d}" for i in range(METRICS)]
    with (directory / "metrics.jsonl").open("w") as f:
        for s in range(STEPS):
            f.write(json.dumps({"step": s + 1, **dict(zip(names, values[s].tolist()))}) + "\n")
    return directory


def report(src: Path, run: Path, out: Path) -> tuple[float, int]:
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONDONTWRITEBYTECODE": "1"}
    command = [sys.executable, "-m", "jaxwise.cli", "report", str(run), "--out", str(out)]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    return time.perf_counter() - start, out.stat().st_size


def main() -> None:
    root = Path(tempfile.mkdtemp())
    run = make_run(root)
    sources = {"now": HERE}
    if os.environ.get("BEFORE_SRC"):
        sources = {"before": Path(os.environ["BEFORE_SRC"]), **sources}
    results: dict[str, list[tuple[float, int]]] = {k: [] for k in sources}
    for _ in range(REPEATS):
        for name, src in sources.items():
            results[name].append(report(src, run, root / f"{name}.html"))
    print(f"load {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores, {STEPS} steps x {METRICS}")
    print("| sources | time (median) | page |\n|---|---|---|")
    for name, rows in results.items():
        seconds = statistics.median(t for t, _ in rows)
        print(f"| {name} | {seconds:.2f} s | {rows[-1][1] / 1e6:.1f} MB |")


if __name__ == "__main__":
    main()

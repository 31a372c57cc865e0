"""The command line as a user meets it: start-up per command, and a 300-class ``train``.

- Start-up: the whole process of ``jaxwise --help``, ``--version``, ``lint FILE``, ``spiral
  --help``, ``train --help`` and ``doctor --json`` against ``python -c pass`` and ``python
  -c "import jax"``, in interleaved rounds (median). Each command imports only what it needs
  (``lint`` neither JAX nor NumPy).
- Many classes: ``jaxwise train`` on 600 rows × 300 classes (4 features, 50 epochs, plots,
  checkpoint) as a whole fresh process, first run (fresh compilation cache) and rerun: wall,
  CPU, the main thread's CPU (the critical path on an idle machine: the other thread builds
  programs meanwhile) and peak memory. Target: ≤ 5 s and < 1 GB.
"""

import csv
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import QUICK, fmt_time, main_guard, table, write_section

ROUNDS = 5 if QUICK else 9
JOB_ROUNDS = 3 if QUICK else 5
JAXWISE = str(Path(sys.executable).with_name("jaxwise"))


def _wall(cmd: list[str], cwd: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, capture_output=True, check=False, timeout=300)
    return time.perf_counter() - t0


def startup_table(work: Path) -> str:
    (work / "ok.py").write_text("import jax\n\nx = jax.numpy.ones(3)\n")
    commands = {
        "`python -c pass`": [sys.executable, "-c", "pass"],
        '`python -c "import jax"`': [sys.executable, "-c", "import jax"],
        "`jaxwise --help`": [JAXWISE, "--help"],
        "`jaxwise --version`": [JAXWISE, "--version"],
        "`jaxwise lint FILE`": [JAXWISE, "lint", "ok.py"],
        "`jaxwise spiral --help`": [JAXWISE, "spiral", "--help"],
        "`jaxwise train --help`": [JAXWISE, "train", "--help"],
        "`jaxwise doctor --json`": [JAXWISE, "doctor", "--json"],
    }
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(ROUNDS):  # interleaved: machine load affects every command alike
        for name, cmd in commands.items():
            samples[name].append(_wall(cmd, work))
    med = {name: statistics.median(s) for name, s in samples.items()}
    base, jax_import = med["`python -c pass`"], med['`python -c "import jax"`']
    rows = [
        [name, fmt_time(t), f"**{t / base:.1f}**", f"{t / jax_import:.2f}"]
        for name, t in med.items()
    ]
    header = [
        f"whole process, median of {ROUNDS} interleaved rounds (ratios from one run)",
        "time",
        "vs `python -c pass`",
        'vs `python -c "import jax"`',
    ]
    return table(header, rows)


def _many_classes_csv(path: Path) -> None:
    rng = np.random.default_rng(0)
    n, k = 600, 300
    x = rng.normal(size=(n, 4))
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([f"f{i}" for i in range(4)] + ["kind"])
        for i, row in enumerate(x):
            writer.writerow([*row.tolist(), f"c{i % k}"])


_CHILD = """
import json, resource, sys, time
from jaxwise.cli import main

code = main(sys.argv[1:])
usage = resource.getrusage(resource.RUSAGE_SELF)
print("STATS " + json.dumps({
    "code": code,
    "main_cpu": time.thread_time(),
    "cpu": usage.ru_utime + usage.ru_stime,
    "max_rss_mib": usage.ru_maxrss / 1024,
}), file=sys.stderr)
"""


def _train_run(work: Path, out: str, cache: Path) -> dict[str, float]:
    env = dict(os.environ, JAX_PLATFORMS="cpu", JAXWISE_CACHE_DIR=str(cache))
    cmd = [sys.executable, "-c", _CHILD, "train", "many.csv", "--label", "kind", "--json"]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, "--out", out], cwd=work, capture_output=True, text=True, env=env, timeout=900
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"train failed:\n{proc.stderr[-3000:]}")
    stats = json.loads(proc.stderr.split("STATS ")[-1])
    summary = json.loads(proc.stdout)
    return {
        "wall": wall,
        "cpu": stats["cpu"],
        "main_cpu": stats["main_cpu"],
        "max_rss_mib": stats["max_rss_mib"],
        "compiled": summary["compile"]["compiled"],
        "loaded": summary["compile"]["loaded_from_cache"],
        "classes": len(summary["classes"]),
    }


def many_classes_table(work: Path) -> str:
    _many_classes_csv(work / "many.csv")
    runs: dict[str, list[dict[str, float]]] = {"first": [], "rerun": []}
    for i in range(JOB_ROUNDS):
        cache = Path(tempfile.mkdtemp(prefix="jaxwise-bench-cache-"))
        try:
            runs["first"].append(_train_run(work, f"first-{i}", cache))
            runs["rerun"].append(_train_run(work, f"rerun-{i}", cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    rows = []
    for side, label in (("first", "first run (fresh cache)"), ("rerun", "rerun (cache filled)")):
        med = {k: statistics.median(r[k] for r in runs[side]) for k in runs[side][0]}
        rows.append(
            [
                label,
                fmt_time(med["wall"]),
                fmt_time(med["cpu"]),
                f"**{fmt_time(med['main_cpu'])}**",
                f"{med['max_rss_mib']:.0f} MiB",
                f"{int(med['compiled'])} / {int(med['loaded'])}",
                "≤ 5 s, < 1 GB",
            ]
        )
    header = [
        "`jaxwise train` 600 rows × 300 classes, 50 epochs, plots (ratios from one run)",
        "wall",
        "CPU (all threads)",
        "main thread CPU",
        "peak memory",
        "epoch compiled / loaded",
        "target",
    ]
    load = os.getloadavg()[0]
    return (
        table(header, rows)
        + f"\n\nMedian of {JOB_ROUNDS} fresh processes each. The machine's load average was "
        f"{load:.1f} on 2 cores at the end of the run: wall time on a shared machine is the "
        "CPU time stretched by the other processes' share. The main thread's CPU time is the "
        "critical path on an idle 2-core machine (a second thread builds the initial state, "
        "the evaluation programs and matplotlib meanwhile, and writes the checkpoint while "
        "the plots are drawn)."
    )


def run() -> None:
    work = Path(tempfile.mkdtemp(prefix="jaxwise-bench-cli-"))
    try:
        body = startup_table(work) + "\n\n" + many_classes_table(work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_section("cli", "The command line: start-up per command, a 300-class `train`", body)


if __name__ == "__main__":
    main_guard(run)

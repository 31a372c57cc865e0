"""The TPU lane's chunks: every test file once, balanced by measured seconds, each under the cap.

A device command may run 10 minutes; the lane runs the suite as a few pytest processes
("chunks") of at most ``CAP_S`` seconds each, from the per-file seconds in
``tests/accelerator/durations.json`` (measured on the TPU by the lane itself; `update`
rewrites them from its JUnit output). A unit is a test file (``tests/test_x.py``), a helper
module whose docstring examples run (``tests/host64.py``), or ``src/jaxwise`` (the package's
doctests). A unit with no recorded time counts as the file's test count times the mean
per-test seconds the durations give, or ``DEFAULT_S``.

    python3 tests/accelerator/plan.py          # the chunks, with their estimated minutes
    python3 tests/accelerator/plan.py K        # chunk K's units, one a line (lane.sh reads it)
    python3 tests/accelerator/plan.py update JUNIT.xml ...   # durations.json from a lane run

``LANE_UNITS=FILE LANE_FIRST=N`` (for plan.py and lane.sh alike) plans only the units FILE lists
(one a line, ``#`` comments), numbered from chunk N: a later session finishing a lane (the
units no earlier chunk ran, and those it re-runs after fixes); merge.py counts a test re-run
there once, in the later chunk.
"""

from __future__ import annotations

import json
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DURATIONS = Path(__file__).resolve().parent / "durations.json"
CAP_S = 480.0  # 8 minutes a chunk: a device command's limit is 10
DEFAULT_S = 10.0  # a unit the durations do not know yet
DOCTESTS = "src/jaxwise"


def units(root: Path = ROOT) -> list[str]:
    """Every unit the suite collects: the test files, the helpers' doctests, ``src/jaxwise``."""
    tests = sorted(p for p in (root / "tests").glob("*.py") if p.name != "conftest.py")
    return [p.relative_to(root).as_posix() for p in tests] + [DOCTESTS]


def load(path: Path = DURATIONS) -> dict:
    """The durations file: ``{"files": {unit: seconds}, "overhead_s": per-chunk start-up, ...}``."""
    return json.loads(path.read_text())


def estimate(durations: Mapping[str, float], unit: str) -> float:
    """The seconds of ``unit``: recorded, else ``DEFAULT_S``."""
    return float(durations.get(unit, DEFAULT_S))


def plan(
    durations: Mapping[str, float],
    all_units: Iterable[str],
    cap_s: float = CAP_S,
    overhead_s: float = 0.0,
) -> list[list[str]]:
    """The fewest balanced chunks whose estimated seconds (plus ``overhead_s`` each) fit ``cap_s``.

    Longest-processing-time first: the units by decreasing seconds, each to the chunk with the
    least so far; the number of chunks grows until every chunk fits. Each chunk's units are
    sorted by name (the run order); chunks are ordered by their first unit.

    Raises:
        ValueError: a single unit does not fit in ``cap_s`` (split the file), or no units.
    """
    names = sorted(set(all_units))
    if not names:
        raise ValueError("`all_units` must name at least one unit")
    seconds = {u: estimate(durations, u) for u in names}
    too_long = [u for u in names if seconds[u] + overhead_s > cap_s]
    if too_long:
        raise ValueError(f"units longer than a chunk ({cap_s:.0f} s): {too_long}; split them")
    order = sorted(names, key=lambda u: (-seconds[u], u))
    for k in range(1, len(names) + 1):
        loads = [overhead_s] * k
        chunks: list[list[str]] = [[] for _ in range(k)]
        for u in order:
            i = min(range(k), key=lambda j: (loads[j], j))
            chunks[i].append(u)
            loads[i] += seconds[u]
        if max(loads) <= cap_s:
            return sorted((sorted(c) for c in chunks if c), key=lambda c: c[0])
    raise AssertionError("unreachable: one unit per chunk always fits")


def chunk_seconds(chunk: Iterable[str], durations: Mapping[str, float], overhead_s: float) -> float:
    """The estimated seconds of one chunk, start-up included."""
    return overhead_s + sum(estimate(durations, u) for u in chunk)


def unit_of(classname: str) -> str:
    """The unit of a JUnit ``classname``: ``tests.test_x[.Class]`` → ``tests/test_x.py``;
    a doctest of the package (``src.jaxwise.…`` or ``jaxwise.…``) → ``src/jaxwise``."""
    parts = classname.split(".")
    if parts[0] == "tests" and len(parts) >= 2:
        return f"tests/{parts[1]}.py"
    if "jaxwise" in parts[:2]:
        return DOCTESTS
    return classname


def seconds_by_unit(reports: Iterable[Path]) -> dict[str, float]:
    """Per-unit seconds from JUnit reports (a unit run twice, as in a resumed chunk: the last)."""
    result: dict[str, float] = {}
    for report in reports:
        found: dict[str, float] = defaultdict(float)
        for case in ET.parse(report).getroot().iter("testcase"):
            if case.get("classname"):  # a case without one (a collection error) has no unit
                found[unit_of(case.get("classname", ""))] += float(case.get("time") or 0.0)
        result.update(found)
    return result


def update(reports: Iterable[Path], path: Path = DURATIONS, source: str = "") -> dict:
    """Rewrite ``path`` with the units' measured seconds from ``reports`` (others are kept)."""
    data = load(path) if path.exists() else {"files": {}, "overhead_s": 30.0}
    measured = seconds_by_unit(reports)
    files = dict(data["files"])
    files.update({u: max(round(s, 1), 0.1) for u, s in measured.items()})  # 0.1: skipped
    data["files"] = dict(sorted(files.items()))
    if source:
        data["source"] = source
    path.write_text(json.dumps(data, indent=1) + "\n")
    return data


def describe(
    chunks: list[list[str]], durations: Mapping[str, float], overhead_s: float, first: int = 0
) -> str:
    """The chunks as text: index (from ``first``), estimated minutes, units."""
    lines = []
    for k, chunk in enumerate(chunks, start=first):
        minutes = chunk_seconds(chunk, durations, overhead_s) / 60
        lines.append(f"chunk {k}: {minutes:.1f} min, {len(chunk)} units: {' '.join(chunk)}")
    total = sum(chunk_seconds(c, durations, overhead_s) for c in chunks) / 60
    lines.append(f"total: {total:.1f} min in {len(chunks)} chunks (cap {CAP_S / 60:.0f} min)")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    data = load()
    durations, overhead = data["files"], float(data.get("overhead_s", 0.0))
    if argv[:1] == ["update"]:
        update([Path(p) for p in argv[1:]], source="the lane's JUnit reports")
        return 0
    try:
        selected, first = selection(os.environ)
    except ValueError as e:
        print(f"plan: {e}", file=sys.stderr)
        return 2
    chunks = plan(durations, selected, CAP_S, overhead)
    if not argv:
        print(describe(chunks, durations, overhead, first))
        return 0
    k = int(argv[0]) - first
    if not 0 <= k < len(chunks):
        print(
            f"plan: chunk must be {first}..{first + len(chunks) - 1}, got {argv[0]}",
            file=sys.stderr,
        )
        return 2
    print("\n".join(chunks[k]))
    return 0


def selection(env: Mapping[str, str], root: Path = ROOT) -> tuple[list[str], int]:
    """The units to plan and the first chunk's number: every unit from 0, or (a later session
    finishing a lane) the units listed in the file ``LANE_UNITS`` names, numbered from
    ``LANE_FIRST`` so that their records do not collide with the earlier chunks'.

    Raises:
        ValueError: the file names a unit the suite does not have, or ``LANE_FIRST`` < 0.
    """
    everything = units(root)
    first = int(env.get("LANE_FIRST", "0"))
    if first < 0:
        raise ValueError(f"LANE_FIRST must be >= 0, got {first}")
    listed = env.get("LANE_UNITS")
    if not listed:
        return everything, first
    path = Path(listed) if Path(listed).is_absolute() else root / listed
    wanted = [
        u.strip() for u in path.read_text().splitlines() if u.strip() and not u.startswith("#")
    ]
    unknown = sorted(set(wanted) - set(everything))
    if unknown:
        raise ValueError(f"{listed} names units the suite does not have: {unknown}")
    return wanted, first


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

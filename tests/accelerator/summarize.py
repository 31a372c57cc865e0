"""Summarise accelerator test runs (JUnit XML written by run.sh) as the markdown of
tests/ACCELERATOR.md: date, device, JAX, passed/failed/skipped, every skip with its reason and
every failure with its message.

    python3 tests/accelerator/summarize.py ENVIRONMENT.txt RUN.xml [RUN.xml ...] > section.md
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def summarize(environment: str, reports: list[Path]) -> str:
    """The markdown summary of the JUnit ``reports`` run in ``environment`` (one line)."""
    counts: Counter[str] = Counter()
    skipped: Counter[str] = Counter()
    failed: list[str] = []
    seconds = 0.0
    for report in reports:
        root = ET.parse(report).getroot()
        for case in root.iter("testcase"):
            seconds += float(case.get("time", 0) or 0)
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            outcome = "passed"
            for child in case:
                if child.tag == "skipped":
                    outcome = "skipped"
                    skipped[(child.get("message") or "").strip()[:160]] += 1
                elif child.tag in ("failure", "error"):
                    outcome = "failed"
                    message = (child.get("message") or "").strip().splitlines()
                    failed.append(f"{name}: {(message[0] if message else '')[:160]}")
            counts[outcome] += 1
    lines = [
        f"- environment: {environment.strip()}",
        f"- {counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped "
        f"({sum(counts.values())} tests, {seconds / 60:.1f} min of test time, "
        f"{len(reports)} process(es))",
    ]
    if skipped:
        lines.append("- skips, by reason:")
        lines += [f"  - {n} × {reason}" for reason, n in skipped.most_common()]
    if failed:
        lines.append("- failures:")
        lines += [f"  - `{f}`" for f in failed]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    env = Path(sys.argv[1]).read_text()
    sys.stdout.write(summarize(env, [Path(p) for p in sys.argv[2:]]))

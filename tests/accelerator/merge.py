"""Merge the TPU lane's chunk results into one record: JUnit XML, ACCELERATOR.md, durations.

Run anywhere (it needs no JAX), on the folders that the lane's calls brought back (each call's
$OUT: ``record-K.jsonl``, ``junit-K-A.xml``, ``chunk-K.json``, ``environment-K.json``,
``compiles-K-A.json``; a folder may hold several chunks, a chunk may come in several folders,
one per attempt):

    python3 tests/accelerator/merge.py DIR [DIR ...]            # prints the record
    python3 tests/accelerator/merge.py --write DIR [DIR ...]    # also writes the files below

``--write`` replaces the "## Last result" section of tests/ACCELERATOR.md, writes the merged
JUnit XML to build/accelerator/merged.xml and rewrites tests/accelerator/durations.json from
the JUnit times (plan.update). Per test, the last outcome recorded counts (a resumed chunk
runs again the file it was stopped in).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import plan

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "tests" / "ACCELERATOR.md"
MERGED = ROOT / "build" / "accelerator" / "merged.xml"
HEADING = "## Last result"


@dataclass
class Chunk:
    """One chunk's merged results."""

    index: int
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)  # test: (outcome, message)
    units: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    wall_s: int = 0
    attempts: int = 0
    complete: bool = False
    compiles: Counter[str] = field(default_factory=Counter)
    started: str = ""  # when its machine's run began (environment-K.json)
    superseded: int = 0  # its tests that a later chunk ran again (counted there)

    def counts(self) -> Counter[str]:
        return Counter(outcome for outcome, _ in self.outcomes.values())


def _chunk_of(name: str) -> int:
    return int(name.split("-")[1].split(".")[0])


def collect(folders: list[Path]) -> tuple[dict[int, Chunk], dict, list[Path]]:
    """``(chunks, environment, junit files)`` from the lane's folders."""
    chunks: dict[int, Chunk] = {}
    environment: dict = {}
    records: dict[int, list[str]] = {}
    junits: list[Path] = []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if not path.is_file():
                continue
            name = path.name
            if name.startswith("record-") and name.endswith(".jsonl"):
                lines = path.read_text().splitlines()
                k = _chunk_of(name)
                if len(lines) > len(records.get(k, [])):  # the latest copy holds the most
                    records[k] = lines
            elif name.startswith("junit-") and name.endswith(".xml"):
                junits.append(path)
            elif name.startswith("chunk-") and name.endswith(".json"):
                data = json.loads(path.read_text())
                chunk = chunks.setdefault(data["chunk"], Chunk(data["chunk"]))
                if len(data["attempts"]) >= chunk.attempts:
                    chunk.attempts = len(data["attempts"])
                    chunk.wall_s = sum(a["wall_s"] for a in data["attempts"])
                    chunk.units, chunk.complete = data["units"], data["complete"]
                chunk.done.update(data["done"])
            elif name.startswith("environment-") and name.endswith(".json"):
                env = json.loads(path.read_text())
                chunks.setdefault(_chunk_of(name), Chunk(_chunk_of(name))).started = str(
                    env.get("started", "")
                )
                if str(env.get("started", "")) >= str(environment.get("started", "")):
                    environment = env  # the latest run's machine
            elif name.startswith("compiles-") and name.endswith(".json"):
                k = _chunk_of(name)
                chunks.setdefault(k, Chunk(k)).compiles.update(json.loads(path.read_text()))
    for k, lines in records.items():
        chunk = chunks.setdefault(k, Chunk(k))
        for line in lines:
            entry = json.loads(line)
            if "done" in entry:
                chunk.done.add(entry["done"])
                continue
            outcome = entry["outcome"]
            previous = chunk.outcomes.get(entry["test"])
            if entry["when"] == "teardown" and previous and previous[0] != "failed":
                outcome = "failed"  # an error in teardown after a pass
            chunk.outcomes[entry["test"]] = (outcome, entry.get("message", ""))
    _supersede(chunks)
    return dict(sorted(chunks.items())), environment, sorted(junits)


def _unit_of(test: str, units: Sequence[str]) -> str:
    """The unit (a file, or a folder of doctests) of a test id: the longest that prefixes it."""
    path = test.split("::", 1)[0]
    owners = [u for u in units if path == u or path.startswith(u.rstrip("/") + "/")]
    return max(owners, key=len, default=path)


def _supersede(chunks: dict[int, Chunk]) -> None:
    """A unit that several chunks ran (a later session re-running the files it fixed) counts
    once, in the chunk whose run began last: every test an earlier chunk ran of it counts as
    superseded there, also one the later run no longer has (renamed or re-parametrized)."""
    latest: dict[str, int] = {}
    for k, chunk in sorted(chunks.items(), key=lambda kc: (kc[1].started, kc[0])):
        for test in chunk.outcomes:
            latest[_unit_of(test, chunk.units)] = k
    for k, chunk in chunks.items():
        for test in [t for t in chunk.outcomes if latest[_unit_of(t, chunk.units)] != k]:
            del chunk.outcomes[test]
            chunk.superseded += 1


def merged_junit(junits: list[Path]) -> ET.ElementTree:
    """One JUnit report of every test case; a case run in several attempts: the last one."""
    cases: dict[tuple[str, str], ET.Element] = {}
    for path in sorted(junits, key=lambda p: (p.name.split("-")[1], p.name)):
        for case in ET.parse(path).getroot().iter("testcase"):
            cases[(case.get("classname", ""), case.get("name", ""))] = case
    suite = ET.Element("testsuite", name="tpu-lane")
    tally: Counter[str] = Counter()
    seconds = 0.0
    for case in cases.values():
        suite.append(case)
        kinds = {child.tag for child in case}
        tally["failures"] += "failure" in kinds
        tally["errors"] += "error" in kinds
        tally["skipped"] += "skipped" in kinds
        seconds += float(case.get("time") or 0.0)
    suite.set("tests", str(len(cases)))
    for key in ("failures", "errors", "skipped"):
        suite.set(key, str(tally[key]))
    suite.set("time", f"{seconds:.1f}")
    root = ET.Element("testsuites")
    root.append(suite)
    return ET.ElementTree(root)


def markdown(
    chunks: dict[int, Chunk], environment: dict, date: str = "", planned: Sequence[str] = ()
) -> str:
    """The "Last result" section: environment, per chunk counts and device minutes, skips by
    reason, every failure, and the units not run: those of unfinished chunks, and those of
    ``planned`` (every unit of the suite) that no chunk's record names (chunks not run)."""
    env = environment
    date = date or str(env.get("started", "")).split(" ")[0]
    lines = [
        HEADING,
        "",
        f"### {date}: {env.get('device_kind', '?')} ({env.get('backend', '?')}, "
        f"{env.get('device_count', '?')} device(s)), JAX {env.get('jax', '?')}, "
        f"libtpu {env.get('libtpu', '?')}, Python {env.get('python', '?')}",
        "",
        '`bash tests/accelerator/lane.sh K` per chunk (`-m "not slow"`), merged by '
        "`tests/accelerator/merge.py`. Device minutes: the pytest wall time of every attempt.",
        "",
        "| chunk | run began | units | passed | failed | skipped | xfailed | superseded | "
        "device min | attempts | done |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    total: Counter[str] = Counter()
    minutes = 0.0
    skips: Counter[str] = Counter()
    failures: list[str] = []
    not_run: list[str] = []
    superseded = 0
    for k, chunk in chunks.items():
        c = chunk.counts()
        c["passed"] += c.pop("xpassed", 0)  # a non-strict xfail that passed (strict ones fail)
        failed = c["failed"]
        total.update(c)
        minutes += chunk.wall_s / 60
        superseded += chunk.superseded
        lines.append(
            f"| {k} | {chunk.started or '?'} | {len(chunk.units)} | {c['passed']} | {failed} | "
            f"{c['skipped']} | {c['xfailed']} | {chunk.superseded} | {chunk.wall_s / 60:.1f} | "
            f"{chunk.attempts} | {'yes' if chunk.complete else 'no'} |"
        )
        for test, (outcome, message) in sorted(chunk.outcomes.items()):
            if outcome == "skipped":
                skips[message[:160]] += 1
            elif outcome == "failed":
                failures.append(f"`{test}`: {message[:200]}")
        if not chunk.complete:
            not_run += [u for u in chunk.units if u not in chunk.done]
    lines.append(
        f"| all | | {sum(len(c.units) for c in chunks.values())} | {total['passed']} | "
        f"{total['failed']} | {total['skipped']} | {total['xfailed']} | {superseded} | "
        f"{minutes:.1f} | | |"
    )
    compiles: Counter[str] = Counter()
    for chunk in chunks.values():
        compiles.update(chunk.compiles)
    if compiles:
        lines += [
            "",
            f"- compilations: {compiles['compiles']} by XLA, {compiles['cache_loads']} loaded "
            f"from the persistent compilation cache, {compiles['compile_seconds'] / 60:.1f} min",
        ]
    lines += ["", f"- skips, by reason ({sum(skips.values())}):"]
    lines += [f"  - {n} × {reason}" for reason, n in skips.most_common()] or ["  - none"]
    lines += ["", f"- failures ({len(failures)}):"]
    lines += [f"  - {f}" for f in failures] or ["  - none"]
    lines += ["", f"- not run (units of unfinished chunks): {', '.join(not_run) or 'none'}"]
    covered = {u for chunk in chunks.values() for u in chunk.units}
    missing = [u for u in planned if u not in covered]
    lines += [f"- not run (units of chunks not run): {', '.join(missing) or 'none'}", ""]
    return "\n".join(lines)


def replace_section(doc: str, section: str) -> str:
    """``doc`` with its "## Last result" section (to the next ``## `` or the end) replaced."""
    start = doc.find(HEADING)
    if start < 0:
        return doc.rstrip("\n") + "\n\n" + section
    end = doc.find("\n## ", start + len(HEADING))
    section = section.rstrip("\n") + "\n"
    return doc[:start] + section + ("\n" + doc[end + 1 :] if end >= 0 else "")


def main(argv: list[str]) -> int:
    write = "--write" in argv
    folders = [Path(a) for a in argv if a != "--write"]
    if not folders:
        print(__doc__, file=sys.stderr)
        return 2
    chunks, environment, junits = collect(folders)
    section = markdown(chunks, environment, planned=plan.units())
    print(section)
    if write:
        MERGED.parent.mkdir(parents=True, exist_ok=True)
        merged_junit(junits).write(MERGED, encoding="utf-8", xml_declaration=True)
        DOC.write_text(replace_section(DOC.read_text(), section))
        if junits:  # a record kept without its JUnit reports leaves the durations as they are
            plan.update(junits, source="the TPU lane's JUnit reports (merge.py)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

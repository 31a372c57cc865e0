"""The TPU lane's pieces that run anywhere: the chunk planner, the progress record, the merge.

tests/accelerator/plan.py splits the suite into chunks of at most 8 minutes by the committed
per-file durations; lane_progress.py records each test as it finishes (so that a stopped
chunk resumes); merge.py turns the chunks' records into one JUnit report and the "Last
result" section of tests/ACCELERATOR.md.
"""

import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

ACCELERATOR = Path(__file__).parent / "accelerator"
sys.path.insert(0, str(ACCELERATOR))
import merge  # noqa: E402  # pyright: ignore[reportMissingImports]
import plan  # noqa: E402  # pyright: ignore[reportMissingImports]


@pytest.fixture(scope="module")
def committed():
    data = plan.load()
    return data["files"], float(data["overhead_s"])


def test_the_committed_plan_runs_every_unit_once_within_the_cap(committed):
    durations, overhead = committed
    units = plan.units()
    chunks = plan.plan(durations, units, plan.CAP_S, overhead)
    flat = [u for chunk in chunks for u in chunk]
    assert sorted(flat) == sorted(units) and len(flat) == len(set(flat))  # each exactly once
    seconds = [plan.chunk_seconds(c, durations, overhead) for c in chunks]
    assert max(seconds) <= plan.CAP_S == 480.0
    largest = max(plan.estimate(durations, u) for u in units)
    assert max(seconds) - min(seconds) <= largest  # balanced (longest-processing-time first)
    # no fewer chunks would fit: the total needs at least this many
    assert len(chunks) >= sum(seconds) / plan.CAP_S


def test_units_are_every_test_file_the_helpers_and_the_package_doctests():
    units = plan.units()
    tests = Path(__file__).parent
    assert {f"tests/{p.name}" for p in tests.glob("test_*.py")} <= set(units)
    assert {"tests/host64.py", "tests/tolerance.py", plan.DOCTESTS} <= set(units)
    assert "tests/conftest.py" not in units


def test_the_committed_durations_name_their_source_and_the_slowest_files(committed):
    durations, overhead = committed
    assert plan.load()["source"] and 0 < overhead < 120
    assert durations["tests/test_privacy_mf.py"] > 60  # among the slowest on a TPU v5e
    assert all(isinstance(s, (int, float)) and s > 0 for s in durations.values())


def test_a_units_file_plans_the_rest_of_a_lane_from_a_later_chunk_number(tmp_path):
    rest = tmp_path / "rest.txt"
    rest.write_text("# the rest\ntests/test_lane.py\n\nsrc/jaxwise\n")
    env = {"LANE_UNITS": str(rest), "LANE_FIRST": "5"}
    assert plan.selection(env) == (["tests/test_lane.py", "src/jaxwise"], 5)
    assert plan.selection({}) == (plan.units(), 0)
    rest.write_text("tests/test_gone.py\n")
    with pytest.raises(
        ValueError, match=r"names units the suite does not have: \['tests/test_gone.py'\]"
    ):
        plan.selection(env)
    with pytest.raises(ValueError, match="LANE_FIRST must be >= 0"):
        plan.selection({"LANE_FIRST": "-1"})
    kept = sorted((ACCELERATOR / "records").glob("*/rest*.txt"))
    assert kept
    for committed in kept:
        assert plan.selection({"LANE_UNITS": str(committed)})[0]  # every unit it names exists


def test_plan_balances_and_refuses_what_cannot_fit():
    durations = {"a": 300.0, "b": 200.0, "c": 200.0, "d": 100.0}
    chunks = plan.plan(durations, durations, cap_s=420.0, overhead_s=10.0)
    assert sorted(map(sorted, chunks)) == [["a", "d"], ["b", "c"]]
    assert plan.plan(durations, durations, cap_s=900.0) == [["a", "b", "c", "d"]]
    assert plan.plan({}, ["new"], cap_s=60.0) == [["new"]]  # unknown: DEFAULT_S
    with pytest.raises(ValueError, match=r"longer than a chunk .*\['a'\]; split them"):
        plan.plan(durations, durations, cap_s=250.0)
    with pytest.raises(ValueError, match="`all_units` must name at least one unit"):
        plan.plan(durations, [])


def test_the_command_line_prints_the_chunks_and_one_chunk(capsys, monkeypatch):
    for name in ("LANE_UNITS", "LANE_FIRST"):  # a lane's own chunk runs with them set
        monkeypatch.delenv(name, raising=False)
    assert plan.main([]) == 0
    text = capsys.readouterr().out
    assert text.startswith("chunk 0: ") and "min in" in text
    n = text.count("\nchunk ") + 1
    assert plan.main(["0"]) == 0
    assert capsys.readouterr().out.split()[0] in plan.units()
    assert plan.main([str(n)]) == 2
    assert "chunk must be 0.." in capsys.readouterr().err


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" time="1.5"/>
<testcase classname="tests.test_a.TestGroup" name="test_in_class" time="0.5"/>
<testcase classname="tests.test_b" name="test_skip" time="0.25">
  <skipped type="pytest.skip" message="needs mlflow: pip install 'jaxwise[mlflow]'"/></testcase>
<testcase classname="src.jaxwise.cli._doctor" name="jaxwise.cli._doctor.backend_error" time="2.0"/>
</testsuite></testsuites>
"""


def test_junit_times_are_summed_per_unit(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    assert plan.unit_of("tests.test_a.TestGroup") == "tests/test_a.py"
    assert plan.unit_of("jaxwise.numerics._core") == plan.DOCTESTS
    assert plan.seconds_by_unit([report]) == {
        "tests/test_a.py": 2.0,
        "tests/test_b.py": 0.25,
        "src/jaxwise": 2.0,
    }
    path = tmp_path / "durations.json"
    path.write_text(json.dumps({"files": {"tests/test_c.py": 9.0}, "overhead_s": 30.0}))
    data = plan.update([report], path, source="a test")
    assert data["files"] == {
        "src/jaxwise": 2.0,
        "tests/test_a.py": 2.0,
        "tests/test_b.py": 0.2,
        "tests/test_c.py": 9.0,
    }
    assert json.loads(path.read_text())["source"] == "a test"


INNER = """
import pytest

def test_one():
    pass

@pytest.mark.skip(reason="needs mlflow: pip install 'jaxwise[mlflow]'")
def test_two():
    pass

def test_three():
    assert 1 == 2, "three is wrong"
"""


def test_the_progress_plugin_records_each_test_and_each_finished_unit(
    pytester, monkeypatch, inner_pytest_args
):
    monkeypatch.syspath_prepend(str(ACCELERATOR))
    # imported by another test of this worker: the inner run must import (and rewrite) it anew
    monkeypatch.delitem(sys.modules, "lane_progress", raising=False)
    record = pytester.path / "record.jsonl"
    monkeypatch.setenv("LANE_RECORD", str(record))
    monkeypatch.setenv("LANE_COMPILES", str(pytester.path / "compiles.json"))
    monkeypatch.delenv("LANE_ENVIRONMENT", raising=False)
    pytester.makepyfile(test_first=INNER, test_second="def test_four():\n    pass\n")
    # its own ini: the inner run's rootdir (the units' paths) is the pytester folder even when
    # --basetemp puts that folder inside this repository (make test), not the repository's root
    pytester.makeini("[pytest]\n")
    result = pytester.runpytest(*inner_pytest_args, "-p", "lane_progress")
    result.assert_outcomes(passed=2, failed=1, skipped=1)
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    tests = {r["test"].split("::")[1]: (r["outcome"], r["message"]) for r in lines if "test" in r}
    assert tests["test_one"] == ("passed", "")
    assert tests["test_two"] == ("skipped", "needs mlflow: pip install 'jaxwise[mlflow]'")
    assert tests["test_three"][0] == "failed" and "three is wrong" in tests["test_three"][1]
    assert [r["done"] for r in lines if "done" in r] == ["test_first.py", "test_second.py"]
    assert set(json.loads((pytester.path / "compiles.json").read_text())) == {
        "compiles",
        "cache_loads",
        "compile_seconds",
    }


def _chunk_folder(folder: Path, k: int, lines: list[dict], attempts: list[dict], units, done):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"record-{k}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    chunk = {"chunk": k, "attempts": attempts, "units": units, "done": done}
    chunk["complete"] = set(done) == set(units)
    (folder / f"chunk-{k}.json").write_text(json.dumps(chunk))


def _test(name, outcome, message="", when="call"):
    unit = name.split("::")[0]
    return {"test": name, "unit": unit, "when": when, "outcome": outcome, "message": message}


def test_merge_takes_the_last_attempt_and_counts_per_chunk(tmp_path):
    a, b = "tests/test_a.py", "tests/test_b.py"
    first = [_test(f"{a}::t1", "passed"), {"done": a}, _test(f"{b}::t2", "failed", "stopped")]
    _chunk_folder(
        tmp_path / "call1", 0, first, [{"attempt": 1, "exit": 124, "wall_s": 540}], [a, b], [a]
    )
    resumed = [*first, _test(f"{b}::t2", "passed"), _test(f"{b}::t3", "skipped", "needs mlflow")]
    resumed += [{"done": b}]
    attempts = [{"attempt": 1, "exit": 124, "wall_s": 540}, {"attempt": 2, "exit": 0, "wall_s": 60}]
    _chunk_folder(tmp_path / "call2", 0, resumed, attempts, [a, b], [a, b])
    c = "tests/test_c.py"
    _chunk_folder(
        tmp_path / "call3",
        1,
        [_test(f"{c}::t4", "failed", "AssertionError: 3 != 4"), _test(f"{c}::t5", "xfailed")],
        [{"attempt": 1, "exit": 124, "wall_s": 300}],
        [c, "tests/test_d.py"],
        [c],
    )
    (tmp_path / "call3" / "environment-1.json").write_text(
        json.dumps({"device_kind": "TPU v5 lite", "backend": "tpu", "jax": "0.10.2",
                    "started": "2026-12-07 10:00:00 UTC"})
    )  # fmt: skip
    (tmp_path / "call3" / "compiles-1-1.json").write_text(
        json.dumps({"compiles": 10, "cache_loads": 4, "compile_seconds": 12.0})
    )
    chunks, env, _ = merge.collect([tmp_path])
    planned = [a, b, c, "tests/test_d.py", "tests/test_e.py"]
    text = merge.markdown(chunks, env, planned=planned)
    assert "### 2026-12-07: TPU v5 lite (tpu" in text and "JAX 0.10.2" in text
    assert "| 0 | ? | 2 | 2 | 0 | 1 | 0 | 0 | 10.0 | 2 | yes |" in text  # t2 passed resumed
    assert "| 1 | 2026-12-07 10:00:00 UTC | 2 | 0 | 1 | 0 | 1 | 0 | 5.0 | 1 | no |" in text
    assert "| all | | 4 | 2 | 1 | 1 | 1 | 0 | 15.0 | | |" in text
    assert "  - 1 × needs mlflow" in text
    assert "`tests/test_c.py::t4`: AssertionError: 3 != 4" in text
    assert "not run (units of unfinished chunks): tests/test_d.py" in text
    assert "not run (units of chunks not run): tests/test_e.py" in text  # no record names it
    assert "10 by XLA, 4 loaded from the persistent compilation cache" in text


def test_a_later_run_of_a_unit_supersedes_every_earlier_test_of_it(tmp_path):
    # a later session re-runs the file whose failures it fixed, in a chunk of its own
    c, d = "tests/test_c.py", "tests/test_d.py"
    runs = [
        ("first", 1, "2026-12-06 18:47:39 UTC", "failed"),
        ("later", 5, "2026-12-07 09:00:00 UTC", "passed"),
    ]
    for folder, k, started, outcome in runs:
        lines = [_test(f"{c}::t4", outcome, "boom" if outcome == "failed" else ""), {"done": c}]
        if k == 1:  # a test the fix re-parametrized: the later run of its file has it no more
            lines.insert(0, _test(f"{c}::t3", "failed", "weak"))
            lines += [_test(f"{d}::t6", "passed"), {"done": d}]
        units = [c, d] if k == 1 else [c]
        _chunk_folder(
            tmp_path / folder, k, lines, [{"attempt": 1, "exit": 0, "wall_s": 60}], units, units
        )
        env = {"device_kind": "TPU v5 lite", "backend": "tpu", "started": started}
        (tmp_path / folder / f"environment-{k}.json").write_text(json.dumps(env))
    chunks, env, _ = merge.collect([tmp_path])
    assert env["started"].startswith("2026-12-07") and chunks[1].superseded == 2
    text = merge.markdown(chunks, env, planned=[c, d])
    assert "| 1 | 2026-12-06 18:47:39 UTC | 2 | 1 | 0 | 0 | 0 | 2 | 1.0 | 1 | yes |" in text
    assert "| 5 | 2026-12-07 09:00:00 UTC | 1 | 1 | 0 | 0 | 0 | 0 | 1.0 | 1 | yes |" in text
    assert "- failures (0):" in text and "chunks not run): none" in text


def test_merged_junit_keeps_each_case_once_and_the_section_is_replaced(tmp_path):
    first, second = tmp_path / "junit-0-1.xml", tmp_path / "junit-0-2.xml"
    first.write_text(JUNIT.replace('name="test_ok" time="1.5"/>', 'name="test_ok" time="1.5">'
                                   '<failure message="stopped"/></testcase>'))  # fmt: skip
    second.write_text(JUNIT)
    suite = merge.merged_junit([second, first]).getroot()[0]
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("4", "0", "1")
    doc = "# Title\n\nintro\n\n## Last result\n\nold\n\n## After\n\nkept\n"
    new = merge.replace_section(doc, "## Last result\n\nnew\n")
    assert new == "# Title\n\nintro\n\n## Last result\n\nnew\n\n## After\n\nkept\n"
    assert merge.replace_section("# T\n", "## Last result\n\nx\n").endswith(
        "\n\n## Last result\n\nx\n"
    )
    ET.fromstring(ET.tostring(suite))  # well formed

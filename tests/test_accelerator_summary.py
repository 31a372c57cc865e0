"""tests/accelerator/summarize.py: the record of a TPU run counts and names what it saw."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "accelerator"))
from summarize import summarize  # pyright: ignore[reportMissingImports]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" time="1.5"/>
<testcase classname="tests.test_a" name="test_skip" time="0.1">
  <skipped type="pytest.skip" message="needs root"/></testcase>
<testcase classname="tests.test_b" name="test_bad" time="2.4">
  <failure message="AssertionError: 3 != 4&#10;more">trace</failure></testcase>
</testsuite></testsuites>
"""


def test_summary_counts_skips_with_reasons_and_failures(tmp_path):
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    text = summarize("python 3.11.7 jax 0.10.2 backend tpu", [report, report])
    assert "- environment: python 3.11.7 jax 0.10.2 backend tpu" in text
    assert "- 2 passed, 2 failed, 2 skipped (6 tests, 0.1 min of test time, 2 process(es))" in text
    assert "  - 2 × needs root" in text
    assert text.count("`tests.test_b::test_bad: AssertionError: 3 != 4`") == 2

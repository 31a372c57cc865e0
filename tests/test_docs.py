"""Every Python block in README.md and docs/, and every script in examples/, runs as it stands.

Each ```python block runs in a fresh interpreter (as a user would paste it into a file),
in a temporary directory. A block immediately followed by an ```output block must print
every line of it, in order (`...` inside a line matches anything, as in doctest).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)


def _doc_files() -> list[Path]:
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return [f for f in files if "api" not in f.relative_to(ROOT).parts]


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line number, code, expected output or None) for every ```python block of ``text``."""
    blocks = []
    matches = list(FENCE.finditer(text))
    for i, m in enumerate(matches):
        if m.group("info").strip() != "python":
            continue
        expected = None
        if i + 1 < len(matches):
            nxt = matches[i + 1]
            between = text[m.end() : nxt.start()]
            if nxt.group("info").strip() == "output" and not between.strip():
                expected = nxt.group("body")
        blocks.append((text.count("\n", 0, m.start()) + 1, m.group("body"), expected))
    return blocks


def _cases() -> list:
    cases = []
    for path in _doc_files():
        for line, code, expected in python_blocks(path.read_text(encoding="utf-8")):
            rel = path.relative_to(ROOT)
            cases.append(pytest.param(code, expected, id=f"{rel}:{line}"))
    return cases


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["MPLBACKEND"] = "Agg"
    env.pop("XLA_FLAGS", None)
    return env


def _matches(expected_line: str, actual_line: str) -> bool:
    pattern = ".*".join(re.escape(part) for part in expected_line.strip().split("..."))
    return re.fullmatch(pattern, actual_line.strip()) is not None


def assert_prints(expected: str, stdout: str) -> None:
    """Every non-empty expected line matches an actual line, in order."""
    actual = [line for line in stdout.splitlines() if line.strip()]
    position = 0
    for want in (line for line in expected.splitlines() if line.strip()):
        while position < len(actual) and not _matches(want, actual[position]):
            position += 1
        assert position < len(actual), (
            f"expected output line not printed: {want!r}\n--- stdout:\n{stdout}"
        )
        position += 1


def test_collector_finds_blocks_and_outputs() -> None:
    text = (
        "x\n```python\nprint(1)\n```\n```output\n1\n```\n```text\nno\n```\n```python\npass\n```\n"
    )
    blocks = python_blocks(text)
    assert [(line, expected) for line, _, expected in blocks] == [(2, "1\n"), (11, None)]
    assert_prints("a ... c\n", "zz\na b c\n")
    with pytest.raises(AssertionError):
        assert_prints("missing\n", "present\n")


@pytest.mark.slow
@pytest.mark.parametrize(("code", "expected"), _cases())
def test_doc_block_runs(code: str, expected: str | None, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"snippet failed:\n{code}\n--- stderr:\n{result.stderr[-3000:]}"
    if expected is not None:
        assert_prints(expected, result.stdout)


def _examples() -> list:
    return [pytest.param(p, id=p.name) for p in sorted((ROOT / "examples").glob("*.py"))]


@pytest.mark.slow
@pytest.mark.parametrize("script", _examples())
def test_example_runs(script: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"{script.name} failed:\n{result.stderr[-3000:]}"
    assert result.stdout.strip(), f"{script.name} printed nothing"

"""Tests for jaxwise.lint: the rule corpus, dogfooding, the CLI's output, suppression and errors."""

import json
from collections import Counter
from pathlib import Path

import pytest

import jaxwise
from jaxwise.cli import main
from jaxwise.lint import RULES, lint_paths, lint_source

CASES = sorted((Path(__file__).parent / "lint_cases").glob("*.py"))


def expected_codes(path):
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), path
    spec = first.split(":", 1)[1].split()
    return [] if spec == ["-"] else sorted(spec)


def test_corpus_has_three_positives_and_three_near_misses_per_rule():
    counts = Counter((p.name[:5].upper(), p.name.split("_")[1]) for p in CASES)
    for code in RULES:
        assert counts[(code, "pos")] >= 3 and counts[(code, "neg")] >= 3, code


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_corpus_case(path):
    found = sorted(f.code for f in lint_source(path.read_text(), str(path)))
    assert found == expected_codes(path), [f.format() for f in lint_source(path.read_text(), str(path))]


def test_the_package_lints_clean():
    package = Path(jaxwise.__file__).parent
    findings, errors, count = lint_paths([package])
    assert count >= 20 and not errors
    assert not findings, "\n".join(f.format() for f in findings)


def test_noqa_select_ignore():
    src = "import jax\nk = jax.random.PRNGKey(0)  # noqa: JW004\nj = jax.random.PRNGKey(1)\nm = jax.tree_map(abs, 1)  # noqa\n"
    assert [(f.line, f.code) for f in lint_source(src)] == [(3, "JW004")]
    src2 = "import jax\ndef f(k):\n    a = jax.random.normal(k)\n    return jax.random.normal(k), jax.tree_map(abs, 1)\n"
    assert {f.code for f in lint_source(src2)} == {"JW003", "JW004"}
    assert {f.code for f in lint_source(src2, select=["JW003"])} == {"JW003"}
    assert {f.code for f in lint_source(src2, ignore=["jw003"])} == {"JW004"}
    assert [f.code for f in lint_source("x = 1  # noqa: JW001\n")] == []


def test_cli_text_output_and_exit_codes(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import jax\n\ndef f(x):\n    return jax.jit(lambda v: v)(x)\n")
    good = tmp_path / "good.py"
    good.write_text("import jax\n\nkey = jax.random.key(0)\n")
    assert main(["lint", str(good)]) == 0
    capsys.readouterr()
    assert main(["lint", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [f"{bad}:4:12: JW001 jax.jit of a lambda created and called inside `f`: a new function object "
                   "every time, so it is traced and compiled on every call (fix: create the jitted function once "
                   "(module level, or in __init__) and reuse it)"]


def test_cli_json_select_ignore(tmp_path, capsys):
    path = tmp_path / "m.py"
    path.write_text("import jax\nk = jax.random.PRNGKey(0)\nt = jax.tree_map(abs, [1])\n")
    assert main(["lint", str(path), "--format", "json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["files"] == 1 and [f["code"] for f in report["findings"]] == ["JW004", "JW004"]
    assert report["findings"][0]["severity"] == "warning" and report["findings"][0]["line"] == 2
    assert main(["lint", str(path), "--ignore", "JW004"]) == 0
    assert main(["lint", str(path), "--select", "JW001"]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as info:
        main(["lint", str(path), "--select", "JW999"])
    assert info.value.code == 2


def test_cli_errors_per_file_and_missing_paths(tmp_path, capsys):
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ok.py").write_text("import jax\nt = jax.tree_map(abs, [1])\n")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "skip.py").write_text("import jax\nt = jax.tree_map(abs, [1])\n")
    assert main(["lint", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert "broken.py: error: syntax error at line 1" in captured.err
    assert "latin.py: error: not UTF-8" in captured.err
    assert "pkg/ok.py:2:5: JW004" in captured.out and "skip.py" not in captured.out
    assert "Traceback" not in captured.err
    assert main(["lint", str(tmp_path / "nope.py")]) == 2
    assert "no such file or directory" in capsys.readouterr().err

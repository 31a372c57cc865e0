"""Tests for jaxwise.lint: rule corpus, odd inputs, CLI output, suppression, docs, speed."""

import ast
import json
import os
import re
import signal
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

import jaxwise
from jaxwise.cli import main
from jaxwise.lint import MAX_BYTES, RULES, _driver, _jw007_where_singular, lint_paths, lint_source

CASES = sorted((Path(__file__).parent / "lint_cases").glob("*.py"))
LINT_PACKAGE = Path(jaxwise.__file__).parent / "lint"
DOCS = Path(__file__).parents[1] / "docs" / "lint.md"


def expected(path):
    """``# expect: JW002@13 JW004@5`` (or ``-``) → ``[("JW002", 13), ("JW004", 5)]``."""
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect:"), path
    spec = first.split(":", 1)[1].split()
    return [] if spec == ["-"] else [(c.split("@")[0], int(c.split("@")[1])) for c in spec]


@pytest.fixture
def alarm():
    """Fail (instead of hanging forever) if the linter blocks on a FIFO or a device."""

    def on_alarm(signum, frame):
        raise TimeoutError("the linter blocked")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(30)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


# -- the corpus -----------------------------------------------------------------------------


def test_corpus_has_three_positives_and_three_near_misses_per_rule():
    assert list(RULES) == [f"JW{i:03d}" for i in range(1, 12)]
    counts = Counter((p.name[:5].upper(), p.name.split("_")[1]) for p in CASES)
    for code in RULES:
        assert counts[(code, "pos")] >= 3 and counts[(code, "neg")] >= 3, code
    for path in CASES:  # a positive case finds its own rule; a near miss finds nothing
        codes = {c for c, _ in expected(path)}
        assert codes == ({path.name[:5].upper()} if "_pos_" in path.name else set()), path.name


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_corpus_case(path):
    findings = lint_source(path.read_text(), str(path))
    assert [(f.code, f.line) for f in findings] == expected(path), [f.format() for f in findings]


def test_corpus_precision_and_recall_are_perfect():
    tp = fp = fn = 0
    for path in CASES:
        found = Counter((f.code, f.line) for f in lint_source(path.read_text(), str(path)))
        want = Counter(expected(path))
        tp += sum((found & want).values())
        fp += sum((found - want).values())
        fn += sum((want - found).values())
    assert (tp, fp, fn) == (sum(len(expected(p)) for p in CASES), 0, 0)


def test_messages_name_the_thing_and_the_fix():
    src = "import jax.numpy as jnp\nx = jnp.randn(3)\n"
    [finding] = lint_source(src)
    assert finding.message == (
        "`jax.numpy.randn` does not exist (NumPy's `randn` has no jax.numpy counterpart)"
    )
    assert finding.fix == "use jax.random.normal(key, shape)"
    messages = {f.code: f for p in CASES for f in lint_source(p.read_text(), str(p))}
    assert "is does" not in " ".join(f.message for f in messages.values())
    assert "jax.debug.print" in messages["JW009"].fix
    assert "in_axes=(None, 0, …)" in messages["JW010"].fix
    assert (
        "np.array(x, copy=True)" in messages["JW011"].fix and "host_copy" in messages["JW011"].fix
    )
    assert "keeps the old value" in messages["JW008"].message


def test_jw002_issue_example_flags_the_jitted_call_not_the_plain_one():
    src = (
        "import jax\nclass Cfg:\n    def __init__(self, n):\n        self.n = n\n"
        "def g(x, cfg):\n    return x\n"
        "f = jax.jit(g, static_argnums=1)\n"
        "a = f(1.0, Cfg(2))\n"
        "b = g(1.0, Cfg(2))\n"
    )
    assert [(f.code, f.line, f.col) for f in lint_source(src)] == [("JW002", 8, 12)]


def test_jw008_loop_and_reads_in_nested_functions():
    src = (
        "import jax\nscale = 1.0\n"
        "@jax.jit\ndef f(x):\n    def inner(y):\n        return y * scale\n    return inner(x)\n"
        "f(1.0)\nscale = 2.0\n"
    )
    [finding] = lint_source(src)
    assert (finding.code, finding.line) == ("JW008", 6)
    assert "changes (line 9)" in finding.message
    # rebound before anything can call f (no module-level call in between): not stale
    assert lint_source(src.replace("f(1.0)\n", "")) == []


def test_jw007_compound_denominators_and_masks():
    head = "import jax.numpy as jnp\n"
    guarded = head + "def f(a, n):\n    return jnp.where(n > 0, a / jnp.maximum(n, 1), 0)\n"
    assert lint_source(guarded) == []
    unrelated = head + "def f(a, n, m):\n    ok = m > 0\n    return jnp.where(ok, a / n, 0)\n"
    assert lint_source(unrelated) == []
    later = (
        "import jax.numpy as jnp\ndef f(a, n):\n    r = jnp.where(ok, a / n, 0)\n    ok = n > 0\n"
        "    return r\n"
    )
    assert lint_source(later) == []  # the mask is assigned after the where: not the same `ok`
    product = head + "def f(a, x, y):\n    return jnp.where(y != 0, a / (2 * x * y), 0)\n"
    assert [f.code for f in lint_source(product)] == ["JW007"]
    assert _jw007_where_singular.CODE == "JW007"


def test_the_package_lints_clean():
    findings, errors, count = lint_paths([Path(jaxwise.__file__).parent])
    assert count >= 20 and not errors
    assert not findings, "\n".join(f.format() for f in findings)


def test_the_lint_package_imports_neither_jax_nor_numpy():
    """``jaxwise lint`` must start fast: the standard library, jaxwise.lint and
    jaxwise._errors (which imports nothing)."""
    for module in sorted(LINT_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else ([node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            )
            for name in names:
                root = name.split(".")[0]
                assert root not in ("jax", "jaxlib", "numpy", "optax", "flax", "equinox"), (
                    module,
                    name,
                )
                assert root != "jaxwise" or name.startswith(("jaxwise.lint", "jaxwise._errors")), (
                    module,
                    name,
                )


def test_modules_and_functions_stay_small():
    for module in LINT_PACKAGE.glob("*.py"):
        text = module.read_text()
        assert len(text.splitlines()) <= 500, module.name
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                body = node.body[1:] if ast.get_docstring(node) else node.body
                lines = (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1
                assert lines <= 60, (module.name, node.name, lines)


def test_one_traversal_no_ast_walk_on_plain_code(monkeypatch):
    """A large module without where/random draws is analysed without any ast.walk."""
    calls = Counter()
    real_walk, real_children = ast.walk, ast.iter_child_nodes
    monkeypatch.setattr(ast, "walk", lambda n: (calls.update(["walk"]), real_walk(n))[1])
    monkeypatch.setattr(
        ast, "iter_child_nodes", lambda n: (calls.update(["children"]), real_children(n))[1]
    )
    body = "".join(
        f"@jax.jit\ndef f{i}(x, y):\n    z = x @ y + {i}\n    return jnp.tanh(z).sum()\n\n"
        for i in range(300)
    )
    assert lint_source("import jax\nimport jax.numpy as jnp\n\n" + body) == []
    assert calls == Counter()


def test_cold_function_bodies_still_checked_when_jitted():
    src = (
        "import jax\nimport numpy as np\nW = np.zeros((100, 100))\nLIMIT = 200\n"
        "def body(x):\n    for _ in range(LIMIT):\n        x = x + W\n    print(x)\n    return x\n"
        "fast = jax.jit(body)\n"
    )
    assert [(f.code, f.line) for f in lint_source(src)] == [
        ("JW005", 6),
        ("JW006", 7),
        ("JW009", 8),
    ]


def test_noqa_select_ignore():
    src = (
        "import jax\nk = jax.random.PRNGKey(0)  # noqa: JW004\nj = jax.random.PRNGKey(1)\n"
        "m = jax.tree_map(abs, 1)  # noqa\n"
    )
    assert [(f.line, f.code) for f in lint_source(src)] == [(3, "JW004")]
    src2 = (
        "import jax\ndef f(k):\n    a = jax.random.normal(k)\n"
        "    return jax.random.normal(k), jax.tree_map(abs, 1)\n"
    )
    assert {f.code for f in lint_source(src2)} == {"JW003", "JW004"}
    assert {f.code for f in lint_source(src2, select=["JW003"])} == {"JW003"}
    assert {f.code for f in lint_source(src2, ignore=["jw003"])} == {"JW004"}
    assert [f.code for f in lint_source("x = 1  # noqa: JW001\n")] == []


# -- odd inputs (#16) -----------------------------------------------------------------------


def _one_error(paths, **kwargs):
    findings, errors, count = lint_paths(paths, **kwargs)
    assert len(errors) == 1, errors
    return findings, errors[0], count


def test_a_fifo_swapped_in_after_the_check_does_not_block(tmp_path, alarm):
    os.mkfifo(tmp_path / "late.py")
    with pytest.raises(OSError, match="not a regular file any more"):
        _driver._read_regular(tmp_path / "late.py", 100)


def test_fifo_is_skipped_not_opened(tmp_path, alarm):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "ok.py").write_text("import jax\nk = jax.random.PRNGKey(0)\n")
    findings, error, count = _one_error([tmp_path])
    assert error.path.endswith("pipe.py") and "FIFO" in error.message and "skipped" in error.message
    assert count == 1 and [f.code for f in findings] == ["JW004"]
    findings, error, count = _one_error([tmp_path / "pipe.py"])  # explicit: reported, not "0 files"
    assert "FIFO" in error.message and count == 0


@pytest.mark.parametrize("device", ["/dev/null", "/dev/zero"])
def test_symlink_to_a_device_is_never_followed(tmp_path, alarm, device):
    (tmp_path / "dev.py").symlink_to(device)
    _, error, count = _one_error([tmp_path])
    assert error.message == f"a character device (symlink to {device}), not a source file; skipped"
    assert count == 0
    _, error, _ = _one_error([tmp_path / "dev.py"])
    assert "character device" in error.message


def test_broken_symlink_and_symlinked_directory(tmp_path):
    (tmp_path / "gone.py").symlink_to(tmp_path / "missing.py")
    (tmp_path / "loop").symlink_to(tmp_path)  # a directory symlink is not followed (no cycle)
    broken = f"broken symlink (to {tmp_path / 'missing.py'}, which does not exist); skipped"
    _, error, count = _one_error([tmp_path])
    assert error.path.endswith("gone.py") and error.message == broken
    assert count == 0
    _, error, _ = _one_error([tmp_path / "gone.py"])
    assert error.message == broken


def test_huge_file_is_skipped_with_a_notice(tmp_path):
    big = tmp_path / "big.py"
    big.write_text("x = 1\n" * (MAX_BYTES // 6 + 1))
    _, error, count = _one_error([big])
    assert f"over the {MAX_BYTES:,}-byte limit" in error.message and count == 0
    small = tmp_path / "small.py"
    small.write_text("import jax\n" + "x = 1\n" * 100)
    _, error, _ = _one_error([small], max_bytes=100)
    assert error.message == "611 bytes, over the 100-byte limit; skipped"


@pytest.mark.parametrize(
    "source, reason",
    [
        ("x = " + "-" * 100_000 + "1\n", "too deeply nested for Python's parser (MemoryError)"),
        (
            "x = a" + " + a" * 100_000 + "\n",
            "too deeply nested for Python's parser (RecursionError)",
        ),
        (
            "x = " + "(" * 300 + ")" * 300 + "\n",
            "syntax error at line 1: too many nested parentheses",
        ),
    ],
)
def test_deeply_nested_expressions(tmp_path, source, reason):
    path = tmp_path / "deep.py"
    path.write_text(source)
    _, error, count = _one_error([path])
    assert error.message == f"{reason}; skipped" and count == 0


def test_encodings_as_python_reads_them(tmp_path):
    latin = tmp_path / "latin.py"
    latin.write_bytes(
        "# -*- coding: latin-1 -*-\nimport jax\nname = 'café'\nk = jax.random.PRNGKey(0)\n".encode(
            "latin-1"
        )
    )
    bom = tmp_path / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbfimport jax\nk = jax.random.PRNGKey(0)\n")
    findings, errors, count = lint_paths([latin, bom])
    assert errors == [] and count == 2
    assert [(Path(f.path).name, f.line, f.col) for f in findings] == [
        ("latin.py", 4, 5),
        ("bom.py", 2, 5),
    ]


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"x = '\xe9'\n", "cannot decode: not UTF-8, and no `# -*- coding: ... -*-` line"),
        (b"# coding: klingon\nx = 1\n", "cannot decode: unknown encoding: klingon"),
        (b"import jax\nx = 1\x00\n", "null byte at line 2: not Python source"),
        (
            bytes(range(1, 256)) * 4,
            "cannot decode: not valid utf-8 (invalid start byte at byte 127)",
        ),
        (b"\x00\x01\x02ELF", "null byte at line 1: not Python source"),
        (b"def f(:\n", "syntax error at line 1: invalid syntax"),
    ],
)
def test_undecodable_and_binary_files(tmp_path, data, reason):
    path = tmp_path / "odd.bin"  # given explicitly: linted whatever its suffix
    path.write_bytes(data)
    _, error, count = _one_error([path])
    assert error.message.startswith(reason) and error.message.endswith("; skipped"), error.message
    assert count == 0


def test_unreadable_file_and_directory(tmp_path, monkeypatch):
    (tmp_path / "ok.py").write_text("import jax\nk = jax.random.PRNGKey(0)\n")
    (tmp_path / "secret.py").write_text("x = 1\n")
    real_read, real_scandir = _driver._read_regular, os.scandir

    def guarded_read(path, limit):
        if str(path).endswith("secret.py"):
            raise PermissionError(13, "Permission denied")
        return real_read(path, limit)

    def guarded_scandir(path):
        if str(path).endswith("locked"):
            raise PermissionError(13, "Permission denied")
        return real_scandir(path)

    (tmp_path / "locked").mkdir()
    monkeypatch.setattr(_driver, "_read_regular", guarded_read)  # root reads anything
    monkeypatch.setattr(_driver.os, "scandir", guarded_scandir)
    findings, errors, count = lint_paths([tmp_path])
    assert [(Path(e.path).name, e.message) for e in errors] == [
        ("locked", "directory not readable (Permission denied); skipped"),
        ("secret.py", "unreadable (Permission denied); skipped"),
    ]
    assert count == 1 and [f.code for f in findings] == ["JW004"]


def test_paths_given_explicitly_are_always_accounted_for(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.py: no such file or directory"):
        lint_paths([tmp_path / "nope.py"])
    (tmp_path / "empty").mkdir()
    _, error, count = _one_error([tmp_path / "empty"])
    assert error.message == "no Python files (*.py, *.ipynb) under this directory" and count == 0


def test_a_crashing_rule_is_reported_per_file(tmp_path, monkeypatch):
    def broken(ix):
        raise KeyError("boom")

    monkeypatch.setattr(_jw007_where_singular, "check", broken)
    (tmp_path / "a.py").write_text("import jax\n")
    _, error, count = _one_error([tmp_path])
    assert error.message == (
        "internal error in jaxwise lint (KeyError: 'boom'); please report it; skipped"
    )


# -- the CLI --------------------------------------------------------------------------------


def test_cli_text_output_and_exit_codes(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import jax\n\ndef f(x):\n    return jax.jit(lambda v: v)(x)\n")
    good = tmp_path / "good.py"
    good.write_text("import jax\n\nkey = jax.random.key(0)\n")
    assert main(["lint", str(good)]) == 0
    capsys.readouterr()
    assert main(["lint", str(tmp_path)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [
        f"{bad}:4:12: JW001 jax.jit of a lambda created and called inside `f`: a new function "
        "object every time, so it is traced and compiled on every call (fix: create the jitted "
        "function once (module level, or in __init__) and reuse it)"
    ]


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


def test_cli_odd_files_one_line_each(tmp_path, capsys, alarm):
    (tmp_path / "broken.py").write_text("def f(:\n")
    (tmp_path / "latin.py").write_bytes(b"x = '\xe9'\n")
    os.mkfifo(tmp_path / "fifo.py")
    (tmp_path / "null.py").symlink_to("/dev/null")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "ok.py").write_text("import jax\nt = jax.tree_map(abs, [1])\n")
    (tmp_path / ".hidden").mkdir()
    (tmp_path / ".hidden" / "skip.py").write_text("import jax\nt = jax.tree_map(abs, [1])\n")
    assert main(["lint", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert [line.split(": error: ")[0] for line in err[:-1]] == [
        str(tmp_path / name) for name in ("broken.py", "fifo.py", "latin.py", "null.py")
    ]
    assert err[-1] == "1 finding(s) in 1 file(s), 4 unreadable"
    assert "pkg/ok.py:2:5: JW004" in captured.out and "skip.py" not in captured.out
    assert "Traceback" not in captured.err
    assert main(["lint", str(tmp_path / "nope.py")]) == 2
    assert "no such file or directory" in capsys.readouterr().err


# -- the documentation ----------------------------------------------------------------------


def _doc_blocks():
    return re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.S)


@pytest.mark.parametrize("block", _doc_blocks(), ids=lambda b: b.splitlines()[0][:30])
def test_docs_examples_run_and_lint_as_labelled(block, capsys):
    first = block.splitlines()[0]
    codes = [f.code for f in lint_source(block, "docs/lint.md")]
    if first.startswith("# bad:"):
        assert codes == [first.split(":")[1].split()[0]], codes
    else:
        assert codes == [] or "PRNGKey" in block, codes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(block, "docs/lint.md", "exec"), {"__name__": "__docs__"})
    capsys.readouterr()


def test_docs_cover_every_rule():
    text = DOCS.read_text()
    for code in RULES:
        assert f"### {code}:" in text and f"# bad: {code}" in text, code


@pytest.mark.skipif(sys.version_info < (3, 12), reason="Python 3.12 syntax needs Python 3.12")
def test_all_of_python_3_12_syntax_is_traversed():
    src = (
        "import jax\nmatch x:\n    case True:\n        pass\n    case {'a': 1, **rest}:\n"
        "        pass\n    case [1, *others] | None:\n        pass\ntype T = int\n"
        "def f[U](x: U) -> U:\n    return x\nasync def g():\n    async with a as b:\n"
        "        yield [i async for i in b]\nk = jax.random.PRNGKey(0)\n"
    )
    assert [(f.code, f.line) for f in lint_source(src)] == [("JW004", 15)]


@pytest.mark.slow
def test_installed_jax_libraries_lint_without_errors():
    """Every file of flax, equinox, chex and rlax (test extras) and jax_privacy (bench extra,
    when installed) is analysed: no file is skipped."""
    import importlib.util

    roots = []
    for name in ("flax", "equinox", "chex", "rlax", "jax_privacy"):
        spec = importlib.util.find_spec(name)  # located, not imported (their import warns)
        if name == "jax_privacy" and spec is None:
            continue
        assert spec is not None and spec.submodule_search_locations, name
        roots.append(Path(spec.submodule_search_locations[0]))
    findings, errors, count = lint_paths(roots)
    assert errors == [] and count > 250
    assert {f.code for f in findings} <= set(RULES)


def test_lines_are_numbered_as_python_numbers_them():
    """A form feed (common in older code) is not a line break for Python: noqa and the
    hot-text pre-filter must use Python's line numbers."""
    src = (
        "import jax\n\x0c\ndef f(key):\n\x0c    a = jax.random.normal(key)\n"
        "    b = jax.random.normal(key)  # noqa: JW003\n    return jax.random.uniform(key)\n"
    )
    assert [(f.code, f.line) for f in lint_source(src)] == [("JW003", 6)]


def test_old_mac_line_endings():
    src = "import jax\rdef f(key):\r    a = jax.random.normal(key)\r"
    src += "    return jax.random.uniform(key)\r"
    assert [(f.code, f.line) for f in lint_source(src)] == [("JW003", 4)]


def test_deep_structures_the_parser_accepts_do_not_stop_the_analysis():
    """Deeply nested loops (key flow) and long constant sums stay fast and are analysed."""
    body = "import jax\ndef f(key):\n"
    for depth in range(40):
        body += "    " * (depth + 1) + f"for i{depth} in range(3):\n"
    body += "    " * 41 + "x = jax.random.normal(key)\n"
    assert [(f.code, f.line) for f in lint_source(body)] == [("JW003", 43)]
    table = "import jax\nN = " + " + ".join(["1"] * 500) + "\nk = jax.random.PRNGKey(0)\n"
    assert [(f.code, f.line) for f in lint_source(table)] == [("JW004", 3)]


def test_const_int_evaluates_sizes_and_gives_up_on_tables():
    from jaxwise.lint._core import const_int

    def value(expr, consts=None):
        return const_int(ast.parse(expr, mode="eval").body, consts or {})

    assert value("2 ** 10 - 24") == 1000 and value("N * 3", {"N": 5}) == 15
    assert value("1.5") is None and value("True") is None and value("x") is None
    assert value(" + ".join(["1"] * 10)) == 10 and value(" + ".join(["1"] * 40)) is None


@pytest.mark.slow
def test_linting_imports_neither_jax_nor_numpy(tmp_path):
    import subprocess
    import sys

    (tmp_path / "m.py").write_text("import jax\nk = jax.random.PRNGKey(0)\n")
    code = (
        "import sys\nfrom jaxwise.lint import lint_paths\n"
        f"findings, errors, count = lint_paths([{str(tmp_path)!r}])\n"
        "print(len(findings), 'jax' in sys.modules, 'numpy' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "False", "False"]


def test_renamed_imports_still_make_a_body_checked():
    src = (
        "from jax import vmap as vm, grad as g, jit as J\n"
        "def loss(params, x):\n    return (params * x).sum()\n"
        "def per_example(params, xs):\n    return vm(g(loss))(params, xs)\n"
        "def predict(x):\n    return J(lambda v: v + 1)(x)\n"
    )
    assert [(f.code, f.line) for f in lint_source(src)] == [("JW010", 5), ("JW001", 7)]


def test_each_file_is_linted_once(tmp_path):
    (tmp_path / "m.py").write_text("import jax\nk = jax.random.PRNGKey(0)\n")
    findings, errors, count = lint_paths([tmp_path, tmp_path / "m.py", f"{tmp_path}/./m.py"])
    assert (len(findings), errors, count) == (1, [], 1)


def test_jw009_message_shows_the_tracer_as_jax_prints_it(capsys):
    import jax
    import jax.numpy as jnp

    jax.jit(lambda x: print(x) or x)(jnp.float32(1.0))
    printed = capsys.readouterr().out.strip()  # what the user would see: JitTracer(float32[])
    [finding] = lint_source("import jax\n@jax.jit\ndef f(x):\n    print(x)\n    return x\n")
    assert finding.code == "JW009" and f"`{printed}`" in finding.message


# -- notebooks, deep trees, symlink loops (issue #25) ---------------------------------------


def _notebook(path, *cells):
    """A notebook of ``("code" | "markdown", source)`` cells (nbformat 4)."""
    doc = {
        "cells": [{"cell_type": kind, "metadata": {}, "source": source} for kind, source in cells],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(doc))
    return path


REUSE = ["key = jax.random.key(0)\n", "a = jax.random.normal(key, (3,))\n"]


def test_a_notebook_is_linted_cell_by_cell_with_cell_locations(tmp_path, capsys):
    nb = _notebook(
        tmp_path / "nb.ipynb",
        ("markdown", "# uses `jax.random.normal(key)` twice"),
        ("code", ["%matplotlib inline\n", "import jax\n", *REUSE]),
        ("code", ["!pip install jax\n", "x = !ls\n", "b = jax.random.normal(key, (3,))"]),
        ("code", "%%bash\njax.random.normal(key)\n"),
        ("code", "%%time\nc = jax.random.normal(key, (3,))  # noqa: JW003\n"),
        ("code", "jax.random.normal?"),
    )
    as_python = tmp_path / "nb.py"
    as_python.write_text("import jax\n" + "".join(REUSE) + "b = jax.random.normal(key, (3,))\n")
    findings, errors, count = lint_paths([nb, as_python])
    assert errors == [] and count == 2
    by_path = {Path(f.path).name: f for f in findings}
    assert set(by_path) == {"nb.ipynb", "nb.py"} and len(findings) == 2  # the same finding
    cell, plain = by_path["nb.ipynb"], by_path["nb.py"]
    assert (cell.code, cell.cell, cell.line, cell.col) == ("JW003", 3, 3, plain.col)
    assert cell.format().startswith(f"{nb}:cell 3:line 3:{plain.col}: JW003 ")
    assert cell.to_dict()["cell"] == 3 and "cell" not in plain.to_dict()
    assert main(["lint", str(nb)]) == 1
    out, err = capsys.readouterr()
    assert out.startswith(f"{nb}:cell 3:line 3:") and err == "1 finding(s) in 1 file(s)\n"


def test_a_broken_cell_is_reported_and_the_others_still_checked(tmp_path):
    nb = _notebook(
        tmp_path / "nb.ipynb",
        ("code", ["import jax\n", *REUSE]),
        ("code", "def broken(:\n    pass\n"),
        ("code", "b = jax.random.normal(key, (3,))"),
    )
    findings, errors, count = lint_paths([nb])
    assert [(f.code, f.cell, f.line) for f in findings] == [("JW003", 3, 1)] and count == 1
    assert [e.format() for e in errors] == [
        f"{nb}: error: cell 2: syntax error at line 1: invalid syntax; skipped"
    ]


@pytest.mark.parametrize(
    "text, reason",
    [
        ("{not json", "not a Jupyter notebook (invalid JSON at line 1); skipped"),
        ('{"cells": 3}', "not a Jupyter notebook (no list of cells); skipped"),
        ("[1, 2]", "not a Jupyter notebook (no list of cells); skipped"),
    ],
)
def test_a_file_that_is_not_a_notebook(tmp_path, text, reason):
    (tmp_path / "bad.ipynb").write_text(text)
    _, error, count = _one_error([tmp_path / "bad.ipynb"])
    assert error.message == reason and count == 0


def test_notebooks_in_a_directory_are_found_and_checkpoints_skipped(tmp_path):
    _notebook(tmp_path / "a.ipynb", ("code", ["import jax\n", *REUSE, REUSE[1]]))
    (tmp_path / ".ipynb_checkpoints").mkdir()
    _notebook(tmp_path / ".ipynb_checkpoints" / "a-checkpoint.ipynb", ("code", "x = 1"))
    findings, errors, count = lint_paths([tmp_path])
    assert [(Path(f.path).name, f.cell) for f in findings] == [("a.ipynb", 1)] and count == 1


def test_a_1200_level_directory_tree(tmp_path):
    deep = tmp_path
    for _ in range(1200):  # one level at a time (mkdir(parents=True) recurses itself)
        deep = deep / "d"
        deep.mkdir()
    (deep / "m.py").write_text("import jax\nt = jax.tree_map(abs, [1])\n")
    try:
        findings, errors, count = lint_paths([tmp_path])
    finally:  # pytest's recursive clean-up (and os.walk before Python 3.12) cannot delete it
        (deep / "m.py").unlink()
        while deep != tmp_path:
            deep.rmdir()
            deep = deep.parent
    assert [f.code for f in findings] == ["JW004"] and errors == [] and count == 1


def test_symlink_loops_are_named_as_such(tmp_path, capsys):
    (tmp_path / "a.py").symlink_to(tmp_path / "b.py")
    (tmp_path / "b.py").symlink_to(tmp_path / "a.py")
    loop = "symlink loop (the link leads back to itself); skipped"
    findings, errors, count = lint_paths([tmp_path])
    assert [e.message for e in errors] == [loop, loop] and count == 0
    _, error, _ = _one_error([tmp_path / "a.py"])
    assert error.message == loop
    assert main(["lint", str(tmp_path / "a.py")]) == 1
    _, err = capsys.readouterr()
    assert err.splitlines()[0] == f"{tmp_path / 'a.py'}: error: {loop}"

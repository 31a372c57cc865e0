"""No module of ``src/jaxwise`` over 600 lines, no function over 80 (CONTRIBUTING's limits).

A module's size is its line count; a function's, the lines from its ``def`` to its last line
(docstring included, decorators not), for every function: methods and nested functions too.
A concept that outgrows a module is split by concept; a function, into well-named helpers.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "jaxwise"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

# Over the limits on purpose, each with its reason; nothing else may be.
ALLOWED: set[str] = set()


def functions(tree: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
    """``(dotted name, lines)`` of every function under ``tree``, nested ones included."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            name = f"{prefix}.{node.name}"
            yield name, (node.end_lineno or node.lineno) - node.lineno + 1
            yield from functions(node, name)
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}.{node.name}")
        else:
            yield from functions(node, prefix)


def oversized(source: str, module: str, path: str) -> list[str]:
    """``name: N lines`` for the module ``source`` and each of its functions over the limits."""
    found = []
    lines = len(source.splitlines())
    if lines > MAX_MODULE_LINES:
        found.append(f"{path}: {lines} lines (> {MAX_MODULE_LINES})")
    for name, length in functions(ast.parse(source), module):
        if length > MAX_FUNCTION_LINES:
            found.append(f"{name}: {length} lines (> {MAX_FUNCTION_LINES})")
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_or_function_over_the_limits() -> None:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).as_posix()
        found += oversized(path.read_text(encoding="utf-8"), _module_name(path), rel)
    bad = [f for f in found if f.split(":")[0] not in ALLOWED]
    assert not bad, "split by concept / into helpers:\n" + "\n".join(bad)


def _function(name: str, lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}    x{i} = {i}\n" for i in range(lines - 2))
    return f"{indent}def {name}():\n{body}{indent}    return 0\n"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (_function("f", 80), []),
        (_function("f", 81), ["m.f: 81 lines (> 80)"]),
        ("class C:\n" + _function("g", 81, "    "), ["m.C.g: 81 lines (> 80)"]),
        (
            "def outer():\n" + _function("inner", 81, "    ") + "    return inner\n",
            ["m.outer: 83 lines (> 80)", "m.outer.inner: 81 lines (> 80)"],
        ),
        ("x = 1\n" * 601, ["m.py: 601 lines (> 600)"]),
        ("x = 1\n" * 600, []),
    ],
)
def test_oversized_measures_modules_and_every_function(source: str, expected: list[str]) -> None:
    assert oversized(source, "m", "m.py") == expected


def test_module_names_are_dotted_paths() -> None:
    assert _module_name(SRC / "train" / "_loop" / "_fit.py") == "jaxwise.train._loop._fit"
    assert _module_name(SRC / "train" / "__init__.py") == "jaxwise.train"

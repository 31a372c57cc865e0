"""At most 8 % of the public API's annotations are a bare ``Any`` (issues 33, 44 and 49).

The annotations counted are those written on the public callables that
``tests/test_docstrings.py`` walks: every public function, the constructor jaxwise wrote for
each public class, and every public method (parameters, ``*args``/``**kwargs`` and return
types). A bare ``Any`` is an annotation that is ``Any`` itself (``Any``, ``typing.Any`` or the
string ``"Any"``) or ``jaxwise._typing.PyTree`` (any pytree: ``Any`` to a type checker, as
``jaxtyping.PyTree``, and it tells the reader little more); ``dict[str, Any]`` says what the
container is and is not counted here, nor is a role alias of ``_typing`` (``Params``,
``Batch``, ``ModelState``, ...: still ``Any`` to a type checker, but the name says which tree
it is). ``python -m tests.any_share`` reports every annotation of ``src/`` that mentions
``Any``, through such aliases too.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_docstrings import _own_init, public_callables, public_methods

MAX_SHARE = 0.08


def written_annotations(fn: Callable) -> list[ast.expr]:
    """The annotations written on ``fn``'s parameters and return type (none without source)."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return []
    node = ast.parse(source).body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return []
    a = node.args
    params = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
    found = [p.annotation for p in params if p is not None and p.annotation is not None]
    return found + ([node.returns] if node.returns is not None else [])


BARE = frozenset({"Any", "PyTree"})  # PyTree: any pytree, named but roleless


def is_bare_any(annotation: ast.expr) -> bool:
    """``Any``, ``typing.Any``, ``"Any"``, or the same of ``PyTree``."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(annotation, ast.Name):
        return annotation.id in BARE
    return isinstance(annotation, ast.Attribute) and annotation.attr in BARE


def public_functions() -> Iterator[tuple[str, Callable]]:
    """``(dotted name, function)`` for each public function, constructor and method."""
    seen: set[int] = set()
    for dotted, obj in public_callables():
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if not isinstance(obj, type):
            if callable(obj):
                yield dotted, obj
            continue
        init = _own_init(obj)
        if init is not None and inspect.isfunction(init):
            yield f"{dotted}.{init.__name__}", init
        for name, fn, _ in public_methods(obj):
            yield f"{dotted}.{name}", fn


def test_bare_any_is_at_most_8_percent_of_the_public_annotations() -> None:
    counts = []
    for name, fn in public_functions():
        found = written_annotations(fn)
        counts.append((sum(map(is_bare_any, found)), len(found), name))
    bare, total = sum(c[0] for c in counts), sum(c[1] for c in counts)
    assert total > 500  # the walk found the API
    worst = sorted(counts, reverse=True)[:10]
    assert bare / total <= MAX_SHARE, (
        f"{bare}/{total} ({bare / total:.1%}) of the public annotations are a bare Any; "
        "the most: " + ", ".join(f"{name} {k}/{n}" for k, n, name in worst)
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Any", True),
        ("typing.Any", True),
        ("'Any'", True),
        ("dict[str, Any]", False),
        ("Any | None", False),
        ("int", False),
        ("'not valid ('", False),
        ("PyTree", True),
        ("_typing.PyTree", True),
        ("'PyTree'", True),
        ("Params", False),
        ("PyTree | None", False),
    ],
)
def test_is_bare_any(text: str, expected: bool) -> None:
    assert is_bare_any(ast.parse(text, mode="eval").body) is expected


def _example(x: Any, *rest: int, **named: dict[str, Any]) -> Any:
    return x


def test_annotations_reads_every_parameter_and_the_return() -> None:
    found = [ast.unparse(a) for a in written_annotations(_example)]
    assert found == ["Any", "int", "dict[str, Any]", "Any"]
    assert written_annotations(len) == []

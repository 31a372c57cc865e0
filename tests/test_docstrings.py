"""Every public callable has a Google-style docstring that matches its signature.

"Public callable": every function and class listed in ``tests/public_api.txt`` and in its
namespace's ``__all__`` that jaxwise defines (re-exports of other libraries' objects, such as
Optax's state types, are theirs to document), and every public method and property of those classes.
For each:

- a docstring;
- an ``Args:`` section naming exactly its parameters, one entry per parameter, in order
  (``*args`` / ``**kwargs`` written with their stars); a class documents its constructor the
  same way, or, for a record type (dataclass or NamedTuple), in ``Attributes:``;
- a ``Returns:`` section when it returns something (``Yields:`` for a generator);
- a ``Raises:`` section when its body raises an exception itself.

mkdocstrings renders these sections; a grouped entry (``a, b: ...``) or a stale name is
what it cannot parse, hence the exact match. The test fails listing every offender.

The same walk (plus each namespace's module docstring) checks the layout griffe needs to
render an item section as one table row per item: a description that wraps continues on
lines indented further than the item. A continuation at the item's own indentation is a
new item to griffe (a ``Returns:`` description wrapped that way renders as one row per line).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import textwrap
import types
from collections.abc import Callable, Iterator

import gen_public_api
import pytest

SECTION = re.compile(r"^(?P<name>[A-Z][A-Za-z ]*):\s*$")
ENTRY = re.compile(
    r"^(?P<name>\*{0,2}[A-Za-z_][A-Za-z0-9_]*(?:, *\*{0,2}[A-Za-z_]\w*)*)(?: *\([^)]*\))?:"
)
NO_VALUE = {"None", "NoReturn", "Never"}
GENERATOR = re.compile(r"^(Iterator|Generator|collections\.abc\.Iterator|typing\.Iterator)\b")


def sections(doc: str) -> dict[str, list[str]]:
    """Google-style sections of ``doc``: name -> the entry names (empty for prose sections)."""
    lines = inspect.cleandoc(doc).splitlines()
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    indent: int | None = None
    for line in lines:
        match = SECTION.match(line)
        if match:
            current = found.setdefault(match.group("name"), [])
            indent = None
            continue
        if current is None or not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if width == 0:  # prose after the section ends it
            current = None
            continue
        if indent is None:
            indent = width
        if width == indent:
            entry = ENTRY.match(line.strip())
            current.append(entry.group("name") if entry else line.strip())
    return found


# Sections whose body griffe splits into items at the items' indentation.
NAMED_ITEMS = {
    "Args",
    "Arguments",
    "Parameters",
    "Keyword Args",
    "Keyword Arguments",
    "Other Parameters",
    "Attributes",
    "Raises",
    "Warns",
    "Receives",
}
UNNAMED_ITEMS = {"Returns", "Yields"}  # items are ``name: ...`` or one type-less description


def split_items(doc: str) -> list[str]:
    """``Section: line`` for each line of ``doc`` that griffe would read as a stray new item.

    In an ``Args:``-like section every line at the items' indentation must start an entry
    (``name:`` or ``name (type):``). In ``Returns:``/``Yields:``, lines at that indentation
    are separate items only when each is a named entry; otherwise the section is one
    description and its second line at that indentation is a continuation griffe splits off.
    """
    lines = inspect.cleandoc(doc).splitlines()
    bad: list[str] = []
    current: str | None = None
    items: list[str] = []

    def close() -> None:
        if current in UNNAMED_ITEMS and len(items) > 1:
            if not all(ENTRY.match(item) for item in items):
                bad.extend(f"{current}: {item!r}" for item in items[1:])

    indent: int | None = None
    for line in lines:
        match = SECTION.match(line)
        if match:
            close()
            current, indent, items = match.group("name"), None, []
            continue
        if current is None or not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        if width == 0:  # prose after the section ends it
            close()
            current, items = None, []
            continue
        if indent is None:
            indent = width
        if width != indent:
            continue
        items.append(line.strip())
        if current in NAMED_ITEMS and not ENTRY.match(line.strip()):
            bad.append(f"{current}: {line.strip()!r}")
    close()
    return bad


def stray_examples(doc: str) -> list[str]:
    """The ``>>>`` lines of ``doc`` outside an ``Examples:`` section (rendered as prose)."""
    current: str | None = None
    bad = []
    for line in inspect.cleandoc(doc).splitlines():
        match = SECTION.match(line)
        if match:
            current = match.group("name")
        elif line and not line[0].isspace():
            current = None  # prose after a section ends it
        if line.strip().startswith(">>>") and current not in ("Examples", "Example"):
            bad.append(line.strip())
    return bad


def parameter_names(fn: Callable) -> list[str]:
    """The names an ``Args:`` section must list for ``fn``, in order."""
    names = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            names.append(f"*{p.name}")
        elif p.kind is p.VAR_KEYWORD:
            names.append(f"**{p.name}")
        else:
            names.append(p.name)
    return names


def _raises_itself(fn: Callable) -> bool:
    """Whether the body of ``fn`` (not its nested functions) has a ``raise X`` statement."""
    try:
        source = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return False
    tree = ast.parse(source)
    if not tree.body or not isinstance(tree.body[0], ast.FunctionDef | ast.AsyncFunctionDef):
        return False

    def visit(node: ast.AST) -> bool:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                return True
            if visit(child):
                return True
        return False

    return visit(tree.body[0])


def _return_annotation(fn: Callable) -> str | None:
    annotation = inspect.signature(fn).return_annotation
    if annotation is inspect.Signature.empty:
        return None
    return annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)


def check_function(fn: Callable, *, method: bool = False) -> list[str]:
    """Every problem of ``fn``'s docstring (an empty list when it is right)."""
    doc = inspect.getdoc(fn) if not method else fn.__doc__
    if not doc:
        return ["no docstring"]
    found = sections(doc)
    problems = []
    params = parameter_names(fn)
    if method and params and params[0] in ("self", "cls"):
        params = params[1:]
    args = found.get("Args", [])
    if args != params:
        problems.append(f"Args: {args} but the parameters are {params}")
    returns = _return_annotation(fn)
    if returns is None:
        problems.append("no return annotation")
    elif GENERATOR.match(returns):
        if "Yields" not in found:
            problems.append(f"no Yields: section (returns {returns})")
    elif returns not in NO_VALUE and "Returns" not in found:
        problems.append(f"no Returns: section (returns {returns})")
    if _raises_itself(fn) and "Raises" not in found:
        problems.append("raises but has no Raises: section")
    return problems


def _is_record(cls: type) -> bool:
    return dataclasses.is_dataclass(cls) or (issubclass(cls, tuple) and hasattr(cls, "_fields"))


def _own_init(cls: type) -> Callable | None:
    """The ``__init__`` (or ``__new__``) jaxwise wrote for ``cls``, if any."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("jaxwise"):
            return None
        for name in ("__init__", "__new__"):
            if name in vars(klass):
                return getattr(cls, name)
    return None


def check_class(cls: type) -> list[str]:
    """Every problem of ``cls``'s docstring and of its constructor's documentation."""
    doc = cls.__doc__
    if not doc:
        return ["no docstring"]
    found = sections(doc)
    if getattr(cls, "_is_protocol", False) or (_own_init(cls) is None and not _is_record(cls)):
        return []  # a Protocol is never constructed; other classes without one take no args
    params = parameter_names(cls)
    if "Args" in found or not _is_record(cls):
        if found.get("Args", []) != params:
            return [f"Args: {found.get('Args', [])} but the constructor takes {params}"]
        return []
    missing = [p for p in params if p not in found.get("Attributes", [])]
    return [f"Attributes: does not list the fields {missing}"] if missing else []


def public_methods(cls: type) -> Iterator[tuple[str, Callable, bool]]:
    """``(name, function, is_property)`` for each public method jaxwise defines on ``cls``."""
    for klass in cls.__mro__:
        if not klass.__module__.startswith("jaxwise"):
            continue
        for name, attr in vars(klass).items():
            if name.startswith("_"):
                continue
            if isinstance(attr, property):
                if attr.fget is not None:
                    yield name, attr.fget, True
            elif isinstance(attr, staticmethod | classmethod):
                yield name, attr.__func__, False
            elif isinstance(attr, types.FunctionType):
                yield name, attr, False


def public_callables() -> Iterator[tuple[str, object]]:
    """``(dotted name, object)`` for every jaxwise-defined function and class in the list."""
    for dotted in gen_public_api.PATH.read_text().splitlines():
        space, attr = dotted.rsplit(".", 1)
        module = importlib.import_module(space)
        if attr not in getattr(module, "__all__", [attr]):
            continue  # an import the namespace does not export (tests/test_public_api.py)
        obj = getattr(module, attr)
        if isinstance(obj, types.ModuleType) or not callable(obj):
            continue
        if not getattr(obj, "__module__", "").startswith("jaxwise"):
            continue  # a re-export (Optax's state types, typing names)
        yield dotted, obj


def offenders() -> list[str]:
    """``name: problem`` for every public callable whose docstring is wrong."""
    found = []
    seen: set[int] = set()
    for dotted, obj in public_callables():
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, type):
            problems = check_class(obj)
            for name, fn, is_property in public_methods(obj):
                if is_property:
                    problems += [f"{name}: no docstring"] if not fn.__doc__ else []
                else:
                    problems += [f"{name}: {p}" for p in check_function(fn, method=True)]
        else:
            problems = check_function(obj)  # type: ignore[arg-type]
        found += [f"{dotted}: {p}" for p in problems]
    return found


def test_every_public_callable_documents_exactly_its_parameters() -> None:
    bad = offenders()
    assert not bad, f"{len(bad)} docstring problems:\n" + "\n".join(bad)


def documented() -> Iterator[tuple[str, str]]:
    """``(dotted name, docstring)`` for each namespace, public callable, method and property."""
    import jaxwise

    for name in sorted(jaxwise._SUBMODULES):
        module = importlib.import_module(f"jaxwise.{name}")
        yield f"jaxwise.{name}", module.__doc__ or ""
    seen: set[int] = set()
    for dotted, obj in public_callables():
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        yield dotted, (obj.__doc__ if isinstance(obj, type) else inspect.getdoc(obj)) or ""
        if isinstance(obj, type):
            for name, fn, _ in public_methods(obj):
                yield f"{dotted}.{name}", fn.__doc__ or ""


def test_wrapped_section_items_continue_further_indented() -> None:
    bad = [f"{name}: {problem}" for name, doc in documented() for problem in split_items(doc)]
    assert not bad, (
        f"{len(bad)} lines griffe renders as items of their own (indent a wrapped "
        "description's continuation lines further than the item):\n" + "\n".join(bad)
    )


def test_examples_are_in_an_examples_section() -> None:
    """mkdocstrings renders an ``Examples:`` section's ``>>>`` lines as code, others as prose."""
    bad = [f"{name}: {line}" for name, doc in documented() for line in stray_examples(doc)]
    assert not bad, "doctest lines outside an Examples: section:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("F.\n\nExamples:\n    Prose.\n\n    >>> 1\n    1\n", []),
        ("F.\n\n>>> 1\n1\n", [">>> 1"]),
        ("F.\n\nExample (big):\n    >>> 1\n", [">>> 1"]),
        ("F.\n\nExamples:\n    >>> 1\n\nMore prose.\n>>> 2\n", [">>> 2"]),
    ],
)
def test_stray_examples_finds_prompts_outside_examples(doc: str, expected: list[str]) -> None:
    assert stray_examples(doc) == expected


def test_the_layout_walk_covers_namespaces_and_methods() -> None:
    names = dict(documented())
    assert "jaxwise.privacy" in names
    assert "jaxwise.train.TrainState.create" in names


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("F.\n\nReturns:\n    The sum of x\n        and y.\n", []),
        ("F.\n\nReturns:\n    The sum of x\n    and y.\n", ["Returns: 'and y.'"]),
        ("F.\n\nYields:\n    Rows of\n    x.\n", ["Yields: 'x.'"]),
        ("F.\n\nReturns:\n    grads: the gradient.\n    loss: the loss.\n", []),
        ("F.\n\nArgs:\n    x: a\n        number.\n    y (int): b.\n", []),
        ("F.\n\nArgs:\n    x: a\n    number.\n", ["Args: 'number.'"]),
        ("F.\n\nRaises:\n    ValueError: bad\n    input.\n", ["Raises: 'input.'"]),
        ("F.\n\nNote:\n    Prose that\n    wraps.\n", []),
        ("F.\n\nReturns:\n    One.\n\nExamples:\n    >>> 1\n    1\n", []),
    ],
)
def test_split_items_finds_continuations_at_the_item_indent(doc: str, expected: list[str]) -> None:
    assert split_items(doc) == expected


def test_every_namespace_has_an_api_page_in_the_site() -> None:
    """Each namespace of ``jaxwise.__all__`` renders on its own page, listed in the nav."""
    import jaxwise

    root = gen_public_api.PATH.parent.parent
    nav = (root / "mkdocs.yml").read_text()
    index = (root / "docs" / "api" / "index.md").read_text()
    missing = []
    for name in sorted(jaxwise._SUBMODULES):
        page = root / "docs" / "api" / f"{name}.md"
        if not page.exists() or f"::: jaxwise.{name}" not in page.read_text():
            missing.append(f"docs/api/{name}.md with `::: jaxwise.{name}`")
        if f"api/{name}.md" not in nav:
            missing.append(f"api/{name}.md in mkdocs.yml's nav")
        if f"({name}.md)" not in index:
            missing.append(f"a row for jaxwise.{name} in docs/api/index.md")
    assert not missing, missing


def test_the_walk_covers_functions_classes_and_methods() -> None:
    names = dict(public_callables())
    assert "jaxwise.train.make_train_step" in names
    assert "jaxwise.checkpoint.Checkpointer" in names
    assert "jaxwise.optim.EmptyState" not in names  # Optax's own type
    state_class = names["jaxwise.train.TrainState"]
    assert isinstance(state_class, type)
    assert any(name == "create" for name, _, _ in public_methods(state_class))


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            "Sum.\n\nArgs:\n    x: the first,\n        on two lines.\n    y (int): the second.\n"
            "    *rest: more.\n    **options: named.\n\nReturns:\n    The sum.\n",
            {"Args": ["x", "y", "*rest", "**options"], "Returns": ["The sum."]},
        ),
        ("Grouped.\n\nArgs:\n    a, b: both.\n", {"Args": ["a, b"]}),
        ("No sections.\n\nJust prose: with a colon.\n", {}),
    ],
)
def test_sections_parses_google_style(doc: str, expected: dict[str, list[str]]) -> None:
    assert sections(doc) == expected


def _documented(x, y=1):
    """Add.

    Args:
        x: a number.
        y: another.

    Returns:
        ``x + y``.
    """
    return x + y


def _grouped(x: int, y: int) -> int:
    """Add.

    Args:
        x, y: numbers.

    Returns:
        The sum.
    """
    if x < 0:
        raise ValueError("x")
    return x + y


def _wrong(x: int, *args: int, **kwargs: int) -> int:
    """Add.

    Args:
        x: a number.
        args: more.
    """
    return x


def test_check_function_names_each_problem() -> None:
    assert check_function(_documented) == ["no return annotation"]
    assert check_function(_grouped) == [
        "Args: ['x, y'] but the parameters are ['x', 'y']",
        "raises but has no Raises: section",
    ]
    assert check_function(_wrong) == [
        "Args: ['x', 'args'] but the parameters are ['x', '*args', '**kwargs']",
        "no Returns: section (returns int)",
    ]

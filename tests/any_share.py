"""Share of type annotations in ``src/`` that contain ``Any``.

Run from the repository root::

    python -m tests.any_share

Counts every annotation written in the source (parameters, return types, annotated
assignments and dataclass fields); an annotation "contains Any" when ``Any`` appears anywhere
in it (``Any``, ``typing.Any``, ``dict[str, Any]``, ``Callable[..., Any]``, and the same
inside a string annotation), directly or through a type alias defined in ``src/`` whose value
contains ``Any`` (``Params = Any``, matched by name). Prints ``any/total (share%)``, overall
and per top-level module.
"""

from __future__ import annotations

import ast
from collections import Counter
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src" / "jaxwise"


def _annotations(tree: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            a = node.args
            for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]:
                if arg is not None and arg.annotation is not None:
                    found.append(arg.annotation)
            if node.returns is not None:
                found.append(node.returns)
        elif isinstance(node, ast.AnnAssign):
            found.append(node.annotation)
    return found


def _mentions_any(annotation: ast.expr, aliases: frozenset[str] = frozenset()) -> bool:
    for node in ast.walk(annotation):
        if isinstance(node, ast.Name) and (node.id == "Any" or node.id in aliases):
            return True
        if isinstance(node, ast.Attribute) and (node.attr == "Any" or node.attr in aliases):
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                inner = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                continue
            if _mentions_any(inner, aliases):
                return True
    return False


def _any_aliases(trees: list[ast.Module]) -> frozenset[str]:
    """Names of module-level type aliases (``X = ...``, ``type X = ...``) that mean ``Any``."""
    values: dict[str, list[ast.expr]] = {}
    for tree in trees:
        for node in tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target, value = node.targets[0], node.value
            elif isinstance(node, ast.AnnAssign) and node.value is not None:
                target, value = node.target, node.value
            elif type(node).__name__ == "TypeAlias":  # ``type X = ...`` (Python 3.12+)
                target, value = getattr(node, "name"), getattr(node, "value")  # noqa: B009
            else:
                continue
            if isinstance(target, ast.Name) and not isinstance(
                value, ast.List | ast.Tuple | ast.Set | ast.Dict | ast.Call | ast.Constant
            ):
                values.setdefault(target.id, []).append(value)
    aliases: set[str] = set()
    while True:  # aliases of aliases
        found = {
            name
            for name, exprs in values.items()
            if any(_mentions_any(v, frozenset(aliases)) for v in exprs)
        }
        if found <= aliases:
            return frozenset(aliases)
        aliases |= found


def count(root: Path = SRC) -> tuple[Counter[str], Counter[str]]:
    """Annotations containing ``Any`` and all annotations, per top-level module of ``root``."""
    with_any: Counter[str] = Counter()
    total: Counter[str] = Counter()
    paths = sorted(root.rglob("*.py"))
    trees = [ast.parse(path.read_text(), str(path)) for path in paths]
    aliases = _any_aliases(trees)
    for path, tree in zip(paths, trees):
        module = path.relative_to(root).parts[0].removesuffix(".py")
        for annotation in _annotations(tree):
            total[module] += 1
            with_any[module] += _mentions_any(annotation, aliases)
    return with_any, total


def share(root: Path = SRC) -> float:
    """Fraction of all annotations under ``root`` that contain ``Any``."""
    with_any, total = count(root)
    return sum(with_any.values()) / sum(total.values())


def main() -> None:
    with_any, total = count()
    for module in sorted(total):
        n_any, n = with_any[module], total[module]
        print(f"{module:16} {n_any:4}/{n:<4} ({n_any / n:6.1%})")
    n_any, n = sum(with_any.values()), sum(total.values())
    print(f"{'all':16} {n_any:4}/{n:<4} ({n_any / n:6.1%})")


if __name__ == "__main__":
    main()

"""Imports go down the table of ``docs/design.md``; packages talk through public names.

The allowed import directions are the "Layers" tables of ``docs/design.md``, parsed here (the
page and the test cannot drift apart): a unit imports only units of lower rows, between
packages and inside the packages the second table names. No package has an import cycle.
A helper two packages share lives in the private package ``jaxwise/_shared/`` (``_frames.py``),
and a package reaches another only through that package's public names. Every class name is
defined once in the package (two unrelated classes of one name are one name too many).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import jaxwise

SRC = Path(jaxwise.__file__).parent
DESIGN = Path(__file__).resolve().parent.parent / "docs" / "design.md"
Graph = dict[str, set[str]]


# ---- the layering tables of docs/design.md


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each body row of the markdown table whose header row starts ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:  # past the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _units(cell: str) -> list[str]:
    """The backticked unit names that open a cell (``cli`` in "`cli` (the command line)")."""
    return re.findall(r"`([\w.]+)`", cell.split("(")[0])


def layer_table(text: str) -> dict[str, int]:
    """``{unit: row}`` of the table of packages (``| Row | Units | ... |``)."""
    return {u: int(row[0]) for row in _table_rows(text, "| Row | Units |") for u in _units(row[1])}


def inner_tables(text: str) -> dict[str, dict[str, int]]:
    """``{package: {unit: row}}`` of the table inside packages (``| Package | Row | Units |``)."""
    found: dict[str, dict[str, int]] = {}
    for row in _table_rows(text, "| Package | Row | Units |"):
        (package,) = _units(row[0])
        found.setdefault(package, {package: 1_000})  # the package's __init__: its top row
        found[package].update({u: int(row[1]) for u in _units(row[2])})
    return found


def _module_name(path: Path, root: Path) -> str:
    """``train._program._step`` for ``train/_program/_step.py``; ``__init__`` for the root."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _unit(module: str, units: dict[str, int]) -> str | None:
    """The longest unit that names ``module`` (itself or a package above it)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in units:
            return ".".join(parts[:n])
    return None


def import_edges(root: Path = SRC) -> list[tuple[str, str, int]]:
    """``(module, imported module, line)`` for every jaxwise import under ``root``.

    ``from P import name`` imports the module ``P.name`` when there is one, else ``P``;
    function-level and ``TYPE_CHECKING`` imports count. ``__main__.py`` scripts are skipped.
    """
    paths = [p for p in sorted(root.rglob("*.py")) if p.name != "__main__.py"]
    modules = {_module_name(p, root) for p in root.rglob("*.py")}
    edges = []
    for path in paths:
        own = _module_name(path, root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.module and node.level == 0:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    targets.append(sub if sub.removeprefix("jaxwise.") in modules else node.module)
            for target in targets:
                if target == "jaxwise" or target.startswith("jaxwise."):
                    name = target.removeprefix("jaxwise").removeprefix(".") or "__init__"
                    if name != own:
                        edges.append((own, name, node.lineno))
    return edges


def layering_violations(root: Path = SRC, text: str | None = None) -> list[str]:
    """``module:line -> imported (why)`` for every import the tables do not allow."""
    text = DESIGN.read_text() if text is None else text
    rows, inner = layer_table(text), inner_tables(text)
    found = []
    for module, target, line in import_edges(root):
        unit, other = _unit(module, rows), _unit(target, rows)
        if unit is None or other is None:
            missing = module if unit is None else target
            found.append(f"{module}:{line} -> {target} ({missing} is in no row of the table)")
        elif unit != other and rows[other] >= rows[unit]:
            found.append(f"{module}:{line} -> {target} (row {rows[unit]} -> {rows[other]})")
        elif unit == other and unit in inner:
            a, b = _unit(module, inner[unit]), _unit(target, inner[unit])
            assert a is not None and b is not None  # the package itself is always a unit
            if a != b and inner[unit][b] >= inner[unit][a]:
                found.append(f"{module}:{line} -> {target} (inside {unit}: {a} -> {b})")
    return found


def test_imports_follow_the_layering_table_of_the_design_page() -> None:
    found = layering_violations()
    assert not found, "\n".join(found)


def test_the_tables_name_every_package_and_every_root_module() -> None:
    rows = layer_table(DESIGN.read_text())
    assert len(rows) >= 25 and rows["_errors"] < rows["_shared"] < rows["train"] < rows["cli"]
    tops = {_module_name(p, SRC).split(".")[0] for p in SRC.rglob("*.py")}
    assert tops - {"py"} <= set(rows), sorted(tops - set(rows))
    inner = inner_tables(DESIGN.read_text())
    assert inner["train"]["train._program"] < inner["train"]["train._loop"]


def test_at_most_eight_private_modules_at_the_package_root() -> None:
    # the sixth round's contract: private implementation lives in a private package (_shared)
    private = sorted(p.name for p in SRC.glob("_*.py") if p.name != "__init__.py")
    assert len(private) <= 8, private


def test_the_layering_scan_finds_each_kind_of_violation(tmp_path: Path) -> None:
    text = (
        "| Row | Units | What |\n|---|---|---|\n| 2 | `top` | a |\n| 1 | `low` `_shared._x` | b |\n"
        "| 0 | `_shared` | c |\n\n| Package | Row | Units |\n|---|---|---|\n"
        "| `top` | 1 | `top._a` |\n| `top` | 2 | `top._b` |\n"
    )
    for folder in ("top", "low", "_shared", "stray"):
        (tmp_path / folder).mkdir()
    (tmp_path / "top" / "_a.py").write_text("from jaxwise.top import _b\n")  # inside: up
    (tmp_path / "top" / "_b.py").write_text("from jaxwise.top._a import f\nimport jaxwise.low\n")
    (tmp_path / "low" / "_c.py").write_text("def f():\n    from jaxwise.top import g\n")  # up
    (tmp_path / "low" / "_d.py").write_text("from jaxwise._shared._x import h\n")  # same row
    (tmp_path / "_shared" / "_x.py").write_text("from jaxwise._shared import _y\n")  # inside
    (tmp_path / "_shared" / "_y.py").write_text("")
    (tmp_path / "stray" / "_e.py").write_text("from jaxwise._shared._y import k\n")
    (tmp_path / "low" / "__main__.py").write_text("from jaxwise.top import main\n")  # a script
    assert layering_violations(tmp_path, text) == [
        "low._c:2 -> top (row 1 -> 2)",
        "low._d:1 -> _shared._x (row 1 -> 1)",
        "stray._e:1 -> _shared._y (stray._e is in no row of the table)",
        "top._a:1 -> top._b (inside top: top._a -> top._b)",
    ]


# ---- no import cycle


def _import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the jaxwise modules it imports (function-level imports included)."""
    graph: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("jaxwise", *path.relative_to(root).with_suffix("").parts)
        module = ".".join(parts).removesuffix(".__init__")
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {alias.name for alias in node.names}
        # a package's own __init__ re-exports its modules: an edge into it is not a cycle
        graph[module] = {
            d for d in deps if d.startswith("jaxwise") and not module.startswith(d + ".")
        }
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _package_graph(edges: list[tuple[str, str, int]], name: Callable[[str], str]) -> Graph:
    """The import graph between the packages ``name(module)`` names (a package's own
    ``__init__`` re-exporting its sub-packages is no edge)."""
    graph: dict[str, set[str]] = {}
    for module, target, _ in edges:
        a, b = name(module), name(target)
        graph.setdefault(a, set())
        if a != b and not a.startswith(b + ".") and not b.startswith(a + "."):
            graph[a].add(b)
    return graph


def test_no_import_cycle_in_any_package():
    # the fifth round's `_accounting` <-> `_mechanism` circle (a function-level import) is gone
    cycles = _cycles(_import_graph(Path(jaxwise.__file__).parent))
    assert not cycles, cycles
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle_between_packages_or_their_sub_packages():
    # privacy/_mechanisms imports neither _clipping nor _accounting; train/_program not _loop
    edges = import_edges()
    rows = layer_table(DESIGN.read_text())
    units = _package_graph(edges, lambda module: _unit(module, rows) or module)
    sub_packages = _package_graph(edges, lambda module: ".".join(module.split(".")[:2]))
    assert not _cycles(units) and not _cycles(sub_packages), (_cycles(units), _cycles(sub_packages))
    assert len(units) > 20 and "privacy._mechanisms" in sub_packages
    two = [("p._a.x", "p._b.y", 1), ("p._b.z", "p._a.w", 2), ("p", "p._a.x", 3)]
    assert _cycles(_package_graph(two, lambda m: ".".join(m.split(".")[:2]))) == [["p._a", "p._b"]]


# ---- packages talk through public names


def _own_package(path: Path, root: Path) -> str | None:
    """``train`` for ``jaxwise/train/_program/_step.py``; None for a top-level module."""
    parts = path.relative_to(root).parts
    return parts[0] if len(parts) > 1 else None


def _imported(node: ast.Import | ast.ImportFrom) -> list[str]:
    """The dotted names an import statement reaches (``jaxwise.train._program._step`` ...)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.module and node.level == 0:
        return [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return []  # a relative import stays inside its package


def _private_cross_package(name: str, own: str | None) -> bool:
    parts = name.split(".")
    if len(parts) < 3 or parts[0] != "jaxwise" or parts[1].startswith("_"):
        return False  # not a sub-package's module (a top-level private module is shared)
    return parts[1] != own and any(part.startswith("_") for part in parts[2:])


def private_cross_package_imports(root: Path = SRC) -> list[str]:
    """``file:line: name`` for every import of another package's private module."""
    found = []
    for path in sorted(root.rglob("*.py")):
        own = _own_package(path, root)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            bad = [name for name in _imported(node) if _private_cross_package(name, own)]
            if bad:  # one line per import statement
                found.append(f"{path.relative_to(root)}:{node.lineno}: {bad[0]}")
    return found


def test_no_private_cross_package_import() -> None:
    found = private_cross_package_imports()
    assert not found, "\n".join(found)


def test_the_scan_finds_each_form(tmp_path: Path) -> None:
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "_x.py").write_text(
        "from jaxwise.sharding._mesh import data_size\n"
        "import jaxwise.debug._frames\n"
        "from jaxwise.watch import _run\n"
        "def f():\n    from jaxwise.cli._jobs._render import render\n"
        "from jaxwise.train._program._state import TrainState\n"  # its own package: fine
        "from jaxwise._shared._events import publish\n"  # a top-level private module: fine
        "from jaxwise.sharding import data_size\n"  # a public name: fine
        "import jaxwise._shared._frames\n"  # a top-level private module: fine
    )
    found = private_cross_package_imports(tmp_path)
    assert [line.split(": ")[1] for line in found] == [
        "jaxwise.sharding._mesh",
        "jaxwise.debug._frames",
        "jaxwise.watch._run",
        "jaxwise.cli._jobs._render",
    ]


def class_definitions(root: Path = SRC) -> dict[str, list[str]]:
    """``{class name: ["file:line", ...]}`` of every class defined under ``root``."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(f"{path.relative_to(root)}:{node.lineno}")
    return found


def test_each_class_name_is_defined_once() -> None:
    repeated = {name: where for name, where in class_definitions().items() if len(where) > 1}
    assert not repeated, repeated


def test_the_class_scan_finds_a_repeated_name(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "_x.py").write_text("class Program:\n    class Inner: ...\n")
    (tmp_path / "_y.py").write_text("def f():\n    class Program: ...\n")
    found = class_definitions(tmp_path)
    assert found == {"Program": ["_y.py:2", "a/_x.py:1"], "Inner": ["a/_x.py:2"]}


def jax_internal_imports(root: Path = SRC) -> list[str]:
    """``file:line: name`` for every import of ``jax._src`` outside ``jaxwise/_shared/_jax.py``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        if path.relative_to(root).as_posix() == "_shared/_jax.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = _imported(node)
                bad = [n for n in names if n == "jax._src" or n.startswith("jax._src.")]
                if bad:
                    found.append(f"{path.relative_to(root)}:{node.lineno}: {bad[0]}")
    return found


def test_only_the_one_module_imports_jax_internals() -> None:
    # jaxwise/_shared/_jax.py knows both ends of the supported JAX range; nothing else reaches in
    found = jax_internal_imports()
    assert not found, "\n".join(found)


def test_the_internals_scan_finds_each_form(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_a.py").write_text("from jax._src import core\n")
    (tmp_path / "_b.py").write_text("import jax._src.config\n")
    (tmp_path / "_shared").mkdir()
    (tmp_path / "_shared" / "_jax.py").write_text("from jax._src import core\n")  # the allowed one
    (tmp_path / "_c.py").write_text("from jax import numpy\n")
    assert jax_internal_imports(tmp_path) == ["_b.py:1: jax._src.config", "pkg/_a.py:1: jax._src"]


def test_report_reads_the_watch_json_and_never_imports_watch() -> None:
    # `jaxwise report` renders the document `jaxwise watch --json` writes: no circle between them
    found = [
        f"{path.name}:{node.lineno}"
        for path in sorted((SRC / "report").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Import | ast.ImportFrom)
        and any(n == "jaxwise.watch" or n.startswith("jaxwise.watch.") for n in _imported(node))
    ]
    assert not found, found


def test_the_cli_quiets_the_loggers_the_internals_module_names() -> None:
    # cli/__init__.py names JAX's loggers as strings (importing _shared._jax loads jax at start-up)
    from jaxwise._shared._jax import COMPILER_LOGGERS

    assert all(name in (SRC / "cli" / "__init__.py").read_text() for name in COMPILER_LOGGERS)


# Reading Python's frames and tracebacks: allowed only where there is no other way.
FRAME_NAMES = frozenset(
    {
        "_getframe",  # sys._getframe
        "_current_frames",  # sys._current_frames
        "currentframe",  # inspect.currentframe
        "getouterframes",
        "getinnerframes",
        "f_locals",
        "f_back",
        "tb_frame",
        "tb_next",
        "extract_tb",  # traceback.extract_tb
        "walk_tb",
        "extract_stack",
        "walk_stack",
    }
)
FRAME_MODULE_CALLS = frozenset({"stack", "trace"})  # inspect.stack(), inspect.trace()
FRAME_MODULES = ("sys", "inspect", "traceback")
FRAME_READERS = {
    "_shared/_jax.py": "JAX's internals: its frames and trace state, at both ends of the JAX range",
    "watch/_patch.py": "watch's patching: the user's line that jitted a function",
    "watch/_watch.py": "watch: where a compile, a transfer or a NaN happened in the user's code",
    "watch/_names.py": "watch: the user's variable name of a donated array",
    "watch/_run.py": "watch: the watched script's own traceback, without watch's frames",
    "checkpoint/_safety.py": "asyncio's own traceback of an unraisable closed-loop report",
}


def frame_walking_sites(root: Path = SRC, allowed: frozenset[str] = frozenset()) -> list[str]:
    """``file:line: name`` for every read of frames or tracebacks outside ``allowed``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root).as_posix()
        if relative in allowed:
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Attribute):
                value = node.value
                module = value.id if isinstance(value, ast.Name) else None
                if node.attr in FRAME_NAMES or (
                    module == "inspect" and node.attr in FRAME_MODULE_CALLS
                ):
                    names.append(node.attr)
            elif isinstance(node, ast.ImportFrom) and node.module in FRAME_MODULES:
                names += [
                    a.name
                    for a in node.names
                    if a.name in FRAME_NAMES
                    or (node.module == "inspect" and a.name in FRAME_MODULE_CALLS)
                ]
            found += [f"{relative}:{getattr(node, 'lineno', 0)}: {name}" for name in names]
    return found


def test_no_frame_or_traceback_walking_outside_watch_and_the_internals_module() -> None:
    # Runtime state travels in contextvars and exceptions carry their own marks
    # (jaxwise/_shared/_blame.py); reading frames is for watch's patching and JAX's internals.
    found = frame_walking_sites(allowed=frozenset(FRAME_READERS))
    assert not found, "\n".join(found)
    reading = {site.split(":")[0] for site in frame_walking_sites()}
    unused = [name for name in FRAME_READERS if name not in reading]
    assert not unused, f"allowed but no longer reading frames (remove them): {unused}"


def test_the_frame_scan_finds_each_form(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "_a.py").write_text(
        "import sys, inspect, traceback\n"
        "f = sys._getframe(1).f_back\n"  # two reads on one line
        "g = inspect.currentframe()\n"
        "h = inspect.stack()\n"
        "def k(err):\n    return err.__traceback__.tb_next.tb_frame.f_locals\n"
    )
    (tmp_path / "_b.py").write_text(
        "from traceback import extract_tb, format_exc\nfrom inspect import signature\n"
    )
    (tmp_path / "_jax.py").write_text("import sys\nsys._getframe(0)\n")  # allowed below
    (tmp_path / "_c.py").write_text("import contextvars\nx = frame.stack\n")  # fine
    found = frame_walking_sites(tmp_path, frozenset({"_jax.py"}))
    assert sorted(found) == sorted(
        [
            "_b.py:1: extract_tb",
            "pkg/_a.py:2: f_back",
            "pkg/_a.py:2: _getframe",
            "pkg/_a.py:3: currentframe",
            "pkg/_a.py:4: stack",
            "pkg/_a.py:6: f_locals",
            "pkg/_a.py:6: tb_frame",
            "pkg/_a.py:6: tb_next",
        ]
    )

"""Packages talk through public names: no ``from jaxwise.<other package>._private import``.

A helper two packages share lives in the private package ``jaxwise/_shared/`` (``_frames.py``),
and a package reaches another only through that package's public names. Every class name is
defined once in the package (two unrelated classes of one name are one name too many).
"""

from __future__ import annotations

import ast
from pathlib import Path

import jaxwise

SRC = Path(jaxwise.__file__).parent


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

"""Running the rules: on source text, and on files and directories (robust to any input)."""

from __future__ import annotations

import ast
import dataclasses
import errno
import gc
import io
import os
import re
import stat
import tokenize
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

from jaxwise._errors import JaxwiseError
from jaxwise.lint import (
    _jw001_jit_in_loop,
    _jw002_static_class,
    _jw003_key_reuse,
    _jw004_old_api,
    _jw005_large_loop,
    _jw006_captured_array,
    _jw007_where_singular,
    _jw008_stale_global,
    _jw009_print_in_jit,
    _jw010_vmap_grad,
    _jw011_view_donated,
)
from jaxwise.lint._core import Finding, LintError
from jaxwise.lint._index import Index
from jaxwise.lint._notebook import NotebookError, code_cells, join_cells

__all__ = ["MAX_BYTES", "RULES", "lint_paths", "lint_source"]

_RULE_MODULES: tuple[ModuleType, ...] = (
    _jw001_jit_in_loop,
    _jw002_static_class,
    _jw003_key_reuse,
    _jw004_old_api,
    _jw005_large_loop,
    _jw006_captured_array,
    _jw007_where_singular,
    _jw008_stale_global,
    _jw009_print_in_jit,
    _jw010_vmap_grad,
    _jw011_view_donated,
)
RULES: dict[str, str] = {m.CODE: m.SUMMARY for m in _RULE_MODULES}
"""``{code: one-line summary}`` of every rule (``"JW001"``: a jit created and called in a loop)."""
MAX_BYTES = 4 * 1024 * 1024  # larger files are skipped with a notice (generated code, data)
"""Files larger than this many bytes (4 MiB) are skipped with a notice."""
# Every rule needs one of these words in the file: without them, parsing is all there is to do.
_TRIGGER = re.compile(r"jax|equinox")
_NOQA = re.compile(
    r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:\s*,\s*[A-Z]+[0-9]+)*))?", re.IGNORECASE
)


def _suppressed(finding: Finding, lines: list[str]) -> bool:
    if not 1 <= finding.line <= len(lines):
        return False
    match = _NOQA.search(lines[finding.line - 1])
    if match is None:
        return False
    codes = match.group("codes")
    return codes is None or finding.code in {c.strip().upper() for c in codes.split(",")}


def _analyse(tree: ast.Module, text: str, filename: str, codes: set[str]) -> list[Finding]:
    index = Index(tree, filename, text)
    for module in _RULE_MODULES:
        if module.CODE in codes:
            module.check(index)
    return sorted(set(index.findings), key=lambda f: (f.line, f.col, f.code))


def _codes(select: Iterable[str] | None, ignore: Iterable[str] | None) -> set[str]:
    selected = {c.upper() for c in select} if select else set(RULES)
    return selected - ({c.upper() for c in ignore} if ignore else set())


def lint_source(
    text: str,
    filename: str = "<string>",
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
) -> list[Finding]:
    """Analyse Python source text; return the findings (after ``# noqa`` and select/ignore).

    Args:
        text: the module's source.
        filename: the path reported in the findings.
        select: only these rule codes (default: all of ``RULES``).
        ignore: skip these rule codes.

    Returns:
        The findings, sorted by line and column.

    Raises:
        SyntaxError: the text is not valid Python (also for null bytes).
        RecursionError, MemoryError: the text is too deeply nested for Python's parser.

    Examples:
        >>> src = "import jax\\ndef f(x):\\n    return jax.jit(lambda y: y + 1)(x)\\n"
        >>> [f.format() for f in lint_source(src, "m.py")][0].split(":")[:4]
        ['m.py', '3', '12', ' JW001 jax.jit of a lambda created and called inside `f`']
    """
    return _findings(ast.parse(text, filename=filename), text, filename, _codes(select, ignore))


def _findings(tree: ast.Module, text: str, filename: str, codes: set[str]) -> list[Finding]:
    if not _TRIGGER.search(text):
        return []
    findings = _analyse(tree, text, filename, codes)
    if not findings:
        return findings
    lines = text.split("\n")  # numbered as Python does (not at form feeds)
    return [f for f in findings if not _suppressed(f, lines)]


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


_SUFFIXES = (".py", ".ipynb")


def _candidates(root: Path, errors: list[LintError]) -> Iterator[Path]:
    """``*.py`` and ``*.ipynb`` under a directory, sorted, depth first; hidden folders,
    ``__pycache__`` and directory symlinks skipped. Iterative: any depth works."""
    stack: list[Iterator[os.DirEntry[str]]] = []

    def enter(directory: str) -> None:
        try:
            entries = sorted(os.scandir(directory), key=lambda e: e.name)
        except OSError as err:
            errors.append(LintError(directory, f"directory not readable ({err.strerror}); skipped"))
            return
        stack.append(iter(entries))

    enter(str(root))
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            continue
        if entry.name.startswith(".") or entry.name == "__pycache__":
            continue
        if entry.is_dir(follow_symlinks=False):
            enter(entry.path)
        elif entry.name.endswith(_SUFFIXES):
            yield Path(entry.path)


def _unreachable(path: Path, err: OSError) -> str:
    if err.errno == errno.ELOOP:
        return "symlink loop (the link leads back to itself); skipped"
    if os.path.islink(path):
        return f"broken symlink (to {os.readlink(path)}, which does not exist); skipped"
    return f"cannot stat ({err.strerror}); skipped"


def read_source(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """Source decoded as Python does (BOM, PEP 263 coding line); special and huge files refused.

    Args:
        path: the file to read.
        max_bytes: larger files are refused.

    Returns:
        The decoded source text.

    Raises:
        LintSkip: the file cannot be linted; the message says why.
    """
    try:
        info = os.stat(path)  # follows a symlink: its target decides
    except OSError as err:
        raise LintSkip(_unreachable(path, err)) from err
    if not stat.S_ISREG(info.st_mode):
        target = f" (symlink to {os.path.realpath(path)})" if path.is_symlink() else ""
        raise LintSkip(f"{_kind(info.st_mode)}{target}, not a source file; skipped")
    if info.st_size > max_bytes:
        raise LintSkip(f"{info.st_size:,} bytes, over the {max_bytes:,}-byte limit; skipped")
    try:
        data = _read_regular(path, max_bytes + 1)
    except OSError as err:
        raise LintSkip(f"unreadable ({err.strerror}); skipped") from err
    if len(data) > max_bytes:
        raise LintSkip(f"over the {max_bytes:,}-byte limit; skipped")
    encoding = "utf-8"
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        return data.decode(encoding)
    except SyntaxError as err:  # a bad coding line, or undecodable first lines
        reason = str(err.msg)
        if reason.startswith("invalid or missing encoding declaration"):
            reason = "not UTF-8, and no `# -*- coding: ... -*-` line declares another encoding"
        raise LintSkip(f"cannot decode: {reason}; skipped") from err
    except (UnicodeDecodeError, LookupError) as err:
        detail = (
            f"{err.reason} at byte {err.start}" if isinstance(err, UnicodeDecodeError) else str(err)
        )
        raise LintSkip(f"cannot decode: not valid {encoding} ({detail}); skipped") from err


def _read_regular(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of a regular file. Opened without blocking and checked again
    after opening, so a file swapped for a FIFO after the ``stat`` cannot hang the linter."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(0, "not a regular file any more")
        return handle.read(limit)


class LintSkip(JaxwiseError):
    """A file that cannot be linted (the message says why)."""


def _parse(text: str, filename: str) -> ast.Module:
    """``ast.parse``, with every parser failure turned into a one-line ``LintSkip``."""
    if "\x00" in text:
        line = text.count("\n", 0, text.index("\x00")) + 1
        raise LintSkip(f"null byte at line {line}: not Python source; skipped")
    try:
        return ast.parse(text, filename=filename)
    except SyntaxError as err:
        where = f" at line {err.lineno}" if err.lineno else ""
        raise LintSkip(f"syntax error{where}: {err.msg}; skipped") from err
    except (RecursionError, MemoryError) as err:
        reason = f"too deeply nested for Python's parser ({type(err).__name__})"
        raise LintSkip(f"{reason}; skipped") from err
    except ValueError as err:
        raise LintSkip(f"cannot parse ({err}); skipped") from err


def _lint_file(path: Path, codes: set[str], max_bytes: int) -> tuple[list[Finding], list[str]]:
    """Findings of one file and notes on parts skipped; ``LintSkip`` (one line) if unreadable."""
    text = read_source(path, max_bytes)
    if path.suffix == ".ipynb":
        return _lint_notebook(path, text, codes)
    tree = _parse(text, str(path))
    return _checked(tree, text, str(path), codes), []


def _checked(tree: ast.Module, text: str, filename: str, codes: set[str]) -> list[Finding]:
    try:
        return _findings(tree, text, filename, codes)
    except RecursionError as err:
        raise LintSkip("too deeply nested to analyse (RecursionError); skipped") from err
    except Exception as err:  # a bug in a rule must not stop the other files
        raise LintSkip(
            f"internal error in jaxwise lint ({type(err).__name__}: {err}); please report "
            "it; skipped"
        ) from err


def _lint_notebook(path: Path, text: str, codes: set[str]) -> tuple[list[Finding], list[str]]:
    """The code cells as one module; each finding moved to its cell and line."""
    try:
        cells, notes = code_cells(text)
    except NotebookError as err:
        raise LintSkip(f"{err}; skipped") from None
    source, where = join_cells(cells)
    tree = _parse(source, str(path))
    findings = [
        dataclasses.replace(f, cell=where[f.line - 1][0], line=where[f.line - 1][1])
        for f in _checked(tree, source, str(path), codes)
    ]
    return sorted(findings, key=lambda f: (f.cell or 0, f.line, f.col, f.code)), notes


def _expand(paths: Sequence[str | Path], errors: list[LintError]) -> list[Path]:
    """Files to lint; every explicit path that yields nothing is reported."""
    missing = [str(p) for p in paths if not os.path.lexists(p)]
    if missing:
        raise FileNotFoundError(f"{missing[0]}: no such file or directory")
    files: list[Path] = []
    for p in map(Path, paths):
        try:
            os.stat(p)
        except OSError as err:
            errors.append(LintError(str(p), _unreachable(p, err)))
            continue
        if p.is_dir():
            found = list(_candidates(p, errors))
            if not found:
                errors.append(
                    LintError(str(p), "no Python files (*.py, *.ipynb) under this directory")
                )
            files += found
        else:
            files.append(p)  # checked when read: FIFOs, devices and huge files are refused there
    unique: dict[str, Path] = {}  # `lint src src/a.py`: each file once
    for file in files:
        unique.setdefault(os.path.normpath(os.path.abspath(file)), file)
    return list(unique.values())


def lint_paths(
    paths: Sequence[str | Path],
    select: Iterable[str] | None = None,
    ignore: Iterable[str] | None = None,
    *,
    max_bytes: int = MAX_BYTES,
) -> tuple[list[Finding], list[LintError], int]:
    """Lint files and directories (recursing into ``*.py`` and ``*.ipynb``; hidden folders
    skipped; any depth).

    Never blocks or crashes on odd input: FIFOs, devices (also through symlinks),
    symlink loops, files over ``max_bytes``, undecodable or unparsable files and parser
    failures (deep nesting) are reported in ``errors`` and the other files are
    still checked. Source is decoded as Python does (BOM, ``# -*- coding -*-``).
    A Jupyter notebook is linted as its code cells (IPython magics skipped), each finding
    at its cell and line (`Finding.cell`); a cell that does not parse is reported in
    ``errors`` and the others are still checked.

    Args:
        paths: files and directories; a file given explicitly is linted whatever its suffix.
        select: only these rule codes.
        ignore: skip these rule codes.
        max_bytes: larger files are skipped with a notice.

    Returns:
        ``(findings, errors, files_checked)``; ``files_checked`` counts the files
            analysed (not those skipped).

    Raises:
        FileNotFoundError: a path does not exist (checked before any work).

    Examples:
        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (folder / "m.py").write_text("import jax\\nt = jax.tree_map(abs, [1])\\n")
        >>> findings, errors, count = lint_paths([folder])
        >>> [f.code for f in findings], errors, count
        (['JW004'], [], 1)
    """
    errors: list[LintError] = []
    codes = _codes(select, ignore)
    findings: list[Finding] = []
    count = 0
    collecting = gc.isenabled()
    gc.disable()  # ASTs hold no reference cycles: the cyclic collector only costs time here (~15%)
    try:
        for file in _expand(paths, errors):
            try:
                found, notes = _lint_file(file, codes, max_bytes)
            except LintSkip as skip:
                errors.append(LintError(str(file), str(skip)))
                continue
            findings.extend(found)
            errors.extend(LintError(str(file), note) for note in notes)
            count += 1
    finally:
        if collecting:
            gc.enable()
    return findings, errors, count

"""Jupyter notebooks as Python: the code cells, in order, with every line traced to its cell.

A notebook runs its cells in one namespace, so the linter reads the code cells as one module
(a key split in cell 2 and reused in cell 5 is a reuse); each finding is reported at its cell
and line (``nb.ipynb:cell 3:line 2:5``), cells numbered from 1 as the notebook shows them
(markdown cells count). IPython syntax is not Python: line magics and shell escapes
(``%time f()``, ``!pip install``, ``x = !ls``) and help lines (``f?``) become ``pass``;
a cell magic (``%%bash``) makes its cell not Python (skipped silently), except the timing
and capturing ones (``%%time``, ``%%timeit``, ``%%capture``), whose body is Python. A cell
that does not parse is reported and left out; the others are still checked.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re

from jaxwise._errors import JaxwiseError

__all__ = ["Cell", "NotebookError", "code_cells", "join_cells"]

_MAGIC = re.compile(r"^(\s*)(?:[A-Za-z_][\w.]*\s*=\s*)?[%!]")
_HELP = re.compile(r"^(\s*)(?:\?.*|[\w.]+\?\??\s*)$")
_PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun"})


class NotebookError(JaxwiseError, ValueError):
    """The file is not a notebook this linter can read (the message says why)."""


@dataclasses.dataclass(frozen=True)
class Cell:
    """One code cell: its number (1-based, all cells counted) and its Python source."""

    number: int
    source: str


def _text(source: object) -> str:
    if isinstance(source, list):
        return "".join(str(part) for part in source)
    return source if isinstance(source, str) else ""


def _python(source: str) -> str | None:
    """The cell's source with IPython syntax replaced by ``pass`` (None: not a Python cell)."""
    lines = source.split("\n")
    if lines and lines[0].lstrip().startswith("%%"):
        name = lines[0].lstrip()[2:].split(maxsplit=1)[0] if lines[0].strip() != "%%" else ""
        if name not in _PYTHON_CELL_MAGICS:
            return None
        lines[0] = ""
    out = []
    for line in lines:
        match = _MAGIC.match(line) or _HELP.match(line)
        out.append(f"{match.group(1)}pass" if match and line.strip() else line)
    return "\n".join(out)


def code_cells(text: str) -> tuple[list[Cell], list[str]]:
    """The notebook's code cells as Python, and one note per cell left out (why).

    Raises:
        NotebookError: not JSON, or not a notebook (no list of cells).

    Examples:
        >>> nb = {"cells": [{"cell_type": "markdown", "source": "# hi"},
        ...                 {"cell_type": "code", "source": ["!pip install jax\\n", "x = 1"]}]}
        >>> code_cells(json.dumps(nb))
        ([Cell(number=2, source='pass\\nx = 1')], [])
    """
    try:
        doc = json.loads(text)
    except ValueError as err:
        line = getattr(err, "lineno", None)
        where = f" at line {line}" if line else ""
        raise NotebookError(f"not a Jupyter notebook (invalid JSON{where})") from None
    cells = doc.get("cells") if isinstance(doc, dict) else None
    if cells is None and isinstance(doc, dict) and isinstance(doc.get("worksheets"), list):
        sheets = doc["worksheets"]  # nbformat 3
        cells = sheets[0].get("cells") if sheets and isinstance(sheets[0], dict) else None
    if not isinstance(cells, list):
        raise NotebookError("not a Jupyter notebook (no list of cells)")
    found, notes = [], []
    for number, cell in enumerate(cells, start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        source = _python(_text(cell.get("source", cell.get("input", ""))))
        if source is None:  # %%bash, %%html, …: not Python, nothing to report
            continue
        try:
            ast.parse(source)
        except SyntaxError as err:
            where = f" at line {err.lineno}" if err.lineno else ""
            notes.append(f"cell {number}: syntax error{where}: {err.msg}; skipped")
            continue
        except (ValueError, RecursionError, MemoryError) as err:
            notes.append(f"cell {number}: cannot parse ({type(err).__name__}); skipped")
            continue
        found.append(Cell(number, source))
    return found, notes


def join_cells(cells: list[Cell]) -> tuple[str, list[tuple[int, int]]]:
    """One module of the cells, and for each of its lines (1-based) the ``(cell, line)``.

    >>> text, where = join_cells([Cell(1, "a = 1"), Cell(3, "b = 2\\nc = 3")])
    >>> text.split("\\n"), where[2]
    (['a = 1', 'b = 2', 'c = 3'], (3, 2))
    """
    lines: list[str] = []
    where: list[tuple[int, int]] = []
    for cell in cells:
        for i, line in enumerate(cell.source.split("\n"), start=1):
            lines.append(line)
            where.append((cell.number, i))
    return "\n".join(lines), where

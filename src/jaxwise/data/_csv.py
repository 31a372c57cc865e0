"""Users' CSV files: a label column and numeric features, or features only; one-line errors."""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import numpy as np

from jaxwise._checks import check_path

__all__ = ["DataError", "Features", "Table", "load_csv", "load_features"]


class DataError(ValueError):
    """A problem with a user's data file, described in one line."""

    __module__ = "jaxwise.data"


@dataclasses.dataclass(frozen=True)
class Table:
    """A numeric feature table with class labels, as read by :func:`load_csv`.

    Attributes:
      x: float32 ``(N, D)`` features.
      y: int32 ``(N,)`` class indices into ``classes``.
      classes: class names (sorted label values, as strings).
      feature_names: the ``D`` feature column names.
      rows: int64 ``(N,)`` 0-based data-row index of each example in the file
        (header excluded; differs from ``arange(N)`` when rows were dropped).
      dropped: number of rows dropped for missing values (``drop_na``).
    """

    x: np.ndarray
    y: np.ndarray
    classes: tuple[str, ...]
    feature_names: tuple[str, ...]
    rows: np.ndarray
    dropped: int = 0


_MISSING = {"", "na", "nan", "null", "none"}


def load_csv(path: str | os.PathLike[str], label: str, *, drop_na: bool = False) -> Table:
    """Read a CSV with a header row: numeric feature columns and one label column.

    Labels may be integers or strings; classes are their sorted distinct
    values. Every problem raises :class:`DataError` with one line naming the
    file, and the row / column where it applies: missing file, empty file,
    no header, unknown label column (the available ones are listed),
    non-numeric features, missing cells (unless ``drop_na``), a single class.

    Rows are 0-based data rows (the header is not counted).

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "d.csv"
        >>> _ = p.write_text("a,b,kind\\n1,2,cat\\n3,4,dog\\n5,6,cat\\n")
        >>> t = load_csv(p, "kind")
        >>> t.x.shape, t.y.tolist(), t.classes
        ((3, 2), [0, 1, 0], ('cat', 'dog'))
    """
    check_path(path, "path")
    path = Path(path)
    header, body = _read_csv(path, expect=(label,))
    if label not in header:
        raise DataError(
            f"{path}: no label column {label!r}; available columns: {', '.join(header)}"
        )
    feature_names = tuple(h for h in header if h != label)
    if not feature_names:
        raise DataError(f"{path}: no feature columns besides the label {label!r}")
    x, labels, rows, dropped = _parse_body(path, header, body, feature_names, label, drop_na)
    assert labels is not None
    classes = tuple(sorted(set(labels), key=_label_sort_key))
    if len(classes) < 2:
        raise DataError(
            f"{path}: the label column {label!r} has a single class "
            f"({', '.join(map(repr, classes))}); "
            "need at least two"
        )
    index = {c: i for i, c in enumerate(classes)}
    y = np.asarray([index[v] for v in labels], np.int32)
    return Table(x, y, classes, feature_names, rows, dropped)


@dataclasses.dataclass(frozen=True)
class Features:
    """Feature rows (and their labels, when present), as read by :func:`load_features`.

    Attributes:
      x: float32 ``(N, D)`` features in the order of the requested names.
      labels: the ``N`` label strings (numeric labels normalised), or ``None``.
      rows: int64 ``(N,)`` 0-based data-row index of each example in the file.
      dropped: number of rows dropped for missing values (``drop_na``).
    """

    x: np.ndarray
    labels: tuple[str, ...] | None
    rows: np.ndarray
    dropped: int = 0


def load_features(
    path: str | os.PathLike[str],
    feature_names: tuple[str, ...] | list[str],
    *,
    label: str | None = None,
    drop_na: bool = False,
) -> Features:
    """Read the columns ``feature_names`` (and ``label`` if present) from a CSV with a header.

    The file must have exactly these feature columns (in any order), plus optionally the
    label column: a missing or an extra column is a :class:`DataError` naming them. Cells
    are checked as in :func:`load_csv`.

    Examples:
        >>> import tempfile, pathlib
        >>> p = pathlib.Path(tempfile.mkdtemp()) / "new.csv"
        >>> _ = p.write_text("b,a\\n2,1\\n4,3\\n")
        >>> load_features(p, ("a", "b")).x.tolist(), load_features(p, ("a", "b")).labels
        ([[1.0, 2.0], [3.0, 4.0]], None)
    """
    check_path(path, "path")
    if isinstance(feature_names, str) or not hasattr(feature_names, "__iter__"):
        raise TypeError(f"`feature_names` must be a list of column names, got {feature_names!r}")
    path = Path(path)
    names = tuple(feature_names)
    header, body = _read_csv(path, expect=names + ((label,) if label else ()))
    missing = [n for n in names if n not in header]
    extra = [h for h in header if h not in names and h != label]
    if missing:
        raise DataError(
            f"{path}: missing feature column(s) {', '.join(map(repr, missing))}; the model was "
            f"trained on {', '.join(names)}"
        )
    if extra:
        raise DataError(
            f"{path}: unexpected column(s) {', '.join(map(repr, extra))}; the model was trained on "
            f"{', '.join(names)}" + (f" (label column {label!r} optional)" if label else "")
        )
    has_label = label is not None and label in header
    x, labels, rows, dropped = _parse_body(
        path, header, body, names, label if has_label else None, drop_na
    )
    return Features(x, tuple(labels) if labels is not None else None, rows, dropped)


def _read_csv(path: Path, expect: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    """(header, data rows) of a CSV, with the file-level checks (exists, UTF-8, header, shape)."""
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a CSV file")
    if not path.is_file():  # a FIFO or a device (/dev/zero) would be read forever
        raise DataError(f"{path}: not a regular file, expected a CSV file")
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            records = list(csv.reader(f))
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})"
        ) from None
    except csv.Error as err:
        raise DataError(f"{path}: malformed CSV: {err}") from None
    records = [r for r in records if any(cell.strip() for cell in r)]
    if not records:
        raise DataError(f"{path}: the file is empty")
    header = [h.strip() for h in records[0]]
    body = records[1:]
    if _looks_numeric(header) or (not set(expect) & set(header) and _mostly_numeric(header)):
        raise DataError(
            f"{path}: no header row (the first row looks like data: {','.join(header[:5])}…); "
            "add a header row naming the columns"
        )
    _check_printable(header, path, "the header")
    if len(set(header)) != len(header):
        raise DataError(f"{path}: duplicate column names in the header: {header}")
    if not body:
        raise DataError(f"{path}: the file has a header but no data rows")
    for i, record in enumerate(body):
        if len(record) != len(header):
            raise DataError(
                f"{path}: data row {i} has {len(record)} cells, the header has {len(header)}"
            )
    return header, body


def _parse_body(
    path: Path,
    header: list[str],
    body: list[list[str]],
    feature_names: tuple[str, ...],
    label: str | None,
    drop_na: bool,
) -> tuple[np.ndarray, list[str] | None, np.ndarray, int]:
    """(float32 features, normalised labels or None, kept row indices, dropped count)."""
    columns = list(zip(*body))  # column-major: each column parsed by NumPy in one call
    labels = None
    x = np.empty((len(body), len(feature_names)), np.float32)
    missing = np.zeros((len(body), len(feature_names) + 1), bool)
    if label is not None:
        labels = [_normalise_label(cell) for cell in columns[header.index(label)]]
        _check_printable(labels, path, f"label column {label!r}")
        missing[:, -1] = [cell.lower() in _MISSING for cell in labels]
    for j, name in enumerate(feature_names):
        column = columns[header.index(name)]
        values = _parse_column(column, name, path)
        missing[:, j] = np.isnan(values)
        if np.isinf(values).any():
            i = int(np.argmax(np.isinf(values)))
            raise DataError(
                f"{path}: non-finite value {column[i].strip()!r} in data row {i}, column {name!r}"
            )
        with np.errstate(over="ignore"):  # a cell beyond float32's range becomes inf: reported next
            x[:, j] = values
        _check_float32(x[:, j], column, name, path)
    rows = np.arange(len(body), dtype=np.int64)
    if not missing.any():
        return x, labels, rows, 0
    bad_rows = missing.any(axis=1)
    if not drop_na:
        r, c = (int(v) for v in np.argwhere(missing)[0])
        column_name = feature_names[c] if c < len(feature_names) else label
        raise DataError(
            f"{path}: missing value in data row {r}, column {column_name!r} ({int(bad_rows.sum())} "
            "rows have missing values; pass --drop-na to drop them)"
        )
    keep = ~bad_rows
    if not keep.any():
        raise DataError(f"{path}: every row has a missing value")
    if labels is not None:
        labels = [v for v, k in zip(labels, keep.tolist()) if k]
    return x[keep], labels, rows[keep], int(bad_rows.sum())


def _parse_column(column: tuple[str, ...], name: str, path: Path) -> np.ndarray:
    """Float64 values of one column; missing cells (empty, NA, NaN, null) become NaN."""
    try:
        return np.asarray(column, dtype=np.float64)  # fast path: NumPy parses the strings
    except ValueError:
        pass
    out = np.empty(len(column), np.float64)
    for i, cell in enumerate(column):
        text = cell.strip()
        if text.lower() in _MISSING:
            out[i] = np.nan
            continue
        try:
            out[i] = float(text)
        except ValueError:
            raise DataError(
                f"{path}: non-numeric value {text!r} in data row {i}, column {name!r}"
            ) from None
    return out


def _check_float32(values: np.ndarray, column: tuple[str, ...], name: str, path: Path) -> None:
    """Reject what float32 cannot hold: a cell beyond ±3.4e38, or a column whose mean overflows."""
    bad = np.isinf(values)  # NaN marks a missing cell, handled by the caller
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{path}: value {column[i].strip()!r} in data row {i}, column {name!r} overflows "
            "float32 (|x| > 3.4e38); rescale the column"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        mean = np.nanmean(values) if np.isnan(values).any() else values.mean(dtype=np.float32)
    if not np.isfinite(mean) and not np.isnan(values).all():
        raise DataError(
            f"{path}: column {name!r} has values so large that their float32 mean overflows; "
            "rescale the column"
        )


def _normalise_label(cell: str) -> str:
    """One spelling per numeric label: ``1``, ``1.0``, ``01`` and ``1e0`` are the class ``1``."""
    text = cell.strip()
    try:
        value = float(text)
    except ValueError:
        return text
    if not np.isfinite(value):
        return text
    if value == int(value) and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def _check_printable(cells: list[str], path: Path, what: str) -> None:
    for i, cell in enumerate(cells):
        if any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in cell):
            where = f"data row {i}" if what.startswith("label") else "column " + str(i)
            raise DataError(
                f"{path}: control character in {what} ({where}: {cell!r}); labels and "
                "column names must be printable text"
            )


def _mostly_numeric(cells: list[str]) -> bool:
    numeric = 0
    for cell in cells:
        try:
            float(cell)
            numeric += 1
        except ValueError:
            pass
    return numeric * 2 >= len(cells)


def _looks_numeric(cells: list[str]) -> bool:
    try:
        [float(c) for c in cells]
    except ValueError:
        return False
    return True


def _label_sort_key(value: str) -> tuple[int, float, str]:
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)

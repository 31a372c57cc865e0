"""Users' CSV files: a label column and numeric features, or features only; one-line errors."""

from __future__ import annotations

import csv
import dataclasses
import os
from pathlib import Path

import numpy as np

from jaxwise._errors import JaxwiseError
from jaxwise._shared._checks import check_path, missing_path

__all__ = ["DataError", "Features", "Table", "load_csv", "load_features"]


class DataError(JaxwiseError, ValueError):
    """A problem with a user's data file, described in one line."""

    __module__ = "jaxwise.data"


@dataclasses.dataclass(frozen=True)
class Table:
    """A numeric feature table with class labels, as read by `load_csv`.

    Attributes:
        x: float32 ``(N, D)`` features.
        y: int32 ``(N,)`` class indices into ``classes``.
        classes: class names (sorted label values, as strings).
        feature_names: the ``D`` feature column names.
        rows: int64 ``(N,)`` 0-based data-row index of each example in the file as given:
            the header excluded, blank lines and dropped rows counted (``pandas.read_csv(path,
            skip_blank_lines=False).iloc[rows[i]]`` is example ``i``).
        dropped: number of rows dropped for missing values (``drop_na``), rows whose cells
            are all empty included.
        blank_lines: blank lines among the data rows (not data: skipped, but counted in
            ``rows``).
    """

    x: np.ndarray
    y: np.ndarray
    classes: tuple[str, ...]
    feature_names: tuple[str, ...]
    rows: np.ndarray
    dropped: int = 0
    blank_lines: int = 0


_MISSING = {"", "na", "nan", "null", "none"}


def load_csv(path: str | os.PathLike[str], label: str, *, drop_na: bool = False) -> Table:
    """Read a CSV with a header row: numeric feature columns and one label column.

    Labels may be integers or strings; classes are their sorted distinct
    values. Every problem raises [`DataError`][jaxwise.data.DataError] with one line naming
    the file, and the row / column where it applies: missing file, empty file,
    no header, unknown label column (the available ones are listed),
    non-numeric features, missing cells (unless ``drop_na``; a row whose cells are all
    empty is a row with missing values too), a single class. Rows are named by their
    0-based data row (the header not counted; blank lines and dropped rows counted, as
    ``pandas.read_csv(path, skip_blank_lines=False)`` numbers them) and the line where they
    start (quoted cells may span lines).

    Args:
        path: the CSV file.
        label: the name of the label column.
        drop_na: drop rows with missing cells (counted in ``Table.dropped``) instead of
            raising.

    Returns:
        The [`Table`][jaxwise.data.Table].

    Raises:
        DataError: the file cannot be used; the one-line message says where and why.
        TypeError: ``path`` is not a path.

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
    return Table(x, y, classes, feature_names, rows, dropped, body.blank)


@dataclasses.dataclass(frozen=True)
class Features:
    """Feature rows (and their labels, when present), as read by `load_features`.

    Attributes:
        x: float32 ``(N, D)`` features in the order of the requested names.
        labels: the ``N`` label strings (numeric labels normalised), or ``None``.
        rows: int64 ``(N,)`` 0-based data-row index of each example in the file as given
            (as in `Table`).
        dropped: number of rows dropped for missing values (``drop_na``).
        blank_lines: blank lines among the data rows (skipped, counted in ``rows``).
    """

    x: np.ndarray
    labels: tuple[str, ...] | None
    rows: np.ndarray
    dropped: int = 0
    blank_lines: int = 0


def load_features(
    path: str | os.PathLike[str],
    feature_names: tuple[str, ...] | list[str],
    *,
    label: str | None = None,
    drop_na: bool = False,
) -> Features:
    """Read the columns ``feature_names`` (and ``label`` if present) from a CSV with a header.

    The file must have exactly these feature columns (in any order), plus optionally the
    label column: a missing or an extra column is a [`DataError`][jaxwise.data.DataError]
    naming them. Cells are checked as in [`load_csv`][jaxwise.data.load_csv].

    Args:
        path: the CSV file.
        feature_names: the feature columns to read, in the order wanted.
        label: the label column, read when the file has it.
        drop_na: drop rows with missing cells instead of raising.

    Returns:
        The [`Features`][jaxwise.data.Features].

    Raises:
        DataError: the file cannot be used; the one-line message says where and why.
        TypeError: ``path`` is not a path or ``feature_names`` not a list of names.

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
    return Features(x, tuple(labels) if labels is not None else None, rows, dropped, body.blank)


@dataclasses.dataclass
class _Body:
    """The data records of a CSV with where each one is in the file."""

    records: list[list[str]]  # blank lines removed
    rows: np.ndarray  # int64: the 0-based data row of each record (blank lines counted)
    lines: np.ndarray  # int64: the 1-based line where each record starts
    blank: int  # blank lines among the data rows

    def where(self, i: int) -> str:
        return f"data row {int(self.rows[i])} (line {int(self.lines[i])})"


def _is_blank(record: list[str]) -> bool:
    return not record or (len(record) == 1 and not record[0].strip())


def _records(path: Path) -> tuple[list[list[str]], list[int]]:
    """Every CSV record of ``path`` and the line where it starts."""
    records, starts, end = [], [], 0
    try:
        with path.open(newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            try:
                for record in reader:
                    records.append(record)
                    starts.append(end + 1)
                    end = reader.line_num
            except csv.Error as err:
                raise DataError(f"{path}: malformed CSV at line {reader.line_num}: {err}") from None
    except UnicodeDecodeError as err:
        raise DataError(
            f"{path}: not a UTF-8 text file ({err.reason} at byte {err.start})"
        ) from None
    except OSError as err:
        raise DataError(f"{path}: cannot read it ({err.strerror or err})") from None
    return records, starts


def _read_csv(path: Path, expect: tuple[str, ...]) -> tuple[list[str], _Body]:
    """(header, data records) of a CSV, with the file-level checks (exists, UTF-8, header)."""
    problem = missing_path(path)
    if problem is not None:
        raise DataError(f"{path}: {problem}")
    if path.is_dir():
        raise DataError(f"{path}: is a directory, expected a CSV file")
    if not path.is_file():  # a FIFO or a device (/dev/zero) would be read forever
        raise DataError(f"{path}: not a regular file, expected a CSV file")
    records, starts = _records(path)
    first = next((i for i, r in enumerate(records) if not _is_blank(r)), None)
    if first is None:
        raise DataError(f"{path}: the file is empty")
    header = [h.strip() for h in records[first]]
    if _looks_numeric(header) or (not set(expect) & set(header) and _mostly_numeric(header)):
        raise DataError(
            f"{path}: no header row (the first row looks like data: {','.join(header[:5])}…); "
            "add a header row naming the columns"
        )
    _check_printable(header, path, "the header")
    if len(set(header)) != len(header):
        raise DataError(f"{path}: duplicate column names in the header: {header}")
    kept = [
        (row, record, starts[first + 1 + row])
        for row, record in enumerate(records[first + 1 :])
        if not _is_blank(record)
    ]
    if not kept:
        raise DataError(f"{path}: the file has a header but no data rows")
    body = _Body(
        [record for _, record, _ in kept],
        np.asarray([row for row, _, _ in kept], np.int64),
        np.asarray([line for _, _, line in kept], np.int64),
        len(records) - first - 1 - len(kept),
    )
    for i, record in enumerate(body.records):
        if len(record) != len(header):
            raise DataError(
                f"{path}: {body.where(i)} has {len(record)} cells, the header has {len(header)}"
            )
    return header, body


def _parse_body(
    path: Path,
    header: list[str],
    body: _Body,
    feature_names: tuple[str, ...],
    label: str | None,
    drop_na: bool,
) -> tuple[np.ndarray, list[str] | None, np.ndarray, int]:
    """(float32 features, normalised labels or None, kept row indices, dropped count)."""
    columns = list(zip(*body.records))  # column-major: each column parsed by NumPy in one call
    labels = None
    n = len(body.records)
    x = np.empty((n, len(feature_names)), np.float32)
    missing = np.zeros((n, len(feature_names) + 1), bool)
    if label is not None:
        labels = [_normalise_label(cell) for cell in columns[header.index(label)]]
        _check_printable(labels, path, f"label column {label!r}", body)
        missing[:, -1] = [cell.lower() in _MISSING for cell in labels]
    for j, name in enumerate(feature_names):
        column = columns[header.index(name)]
        values = _parse_column(column, name, path, body)
        missing[:, j] = np.isnan(values)
        if missing[:, j].all():
            raise DataError(
                f"{path}: column {name!r} has no values (all {n} cells are missing); remove it "
                "or fill it in"
            )
        if np.isinf(values).any():
            i = int(np.argmax(np.isinf(values)))
            raise DataError(
                f"{path}: non-finite value {column[i].strip()!r} in {body.where(i)}, "
                f"column {name!r}"
            )
        with np.errstate(over="ignore"):  # a cell beyond float32's range becomes inf: reported next
            x[:, j] = values
        _check_float32(x[:, j], column, name, path, body)
    if label is None:
        missing = missing[:, :-1]
    if not missing.any():
        return x, labels, body.rows, 0
    bad_rows = missing.any(axis=1)
    if not drop_na:
        r, c = (int(v) for v in np.argwhere(missing)[0])
        hint = f"({int(bad_rows.sum())} rows have missing values; pass --drop-na to drop them)"
        if missing[r].all():
            raise DataError(f"{path}: {body.where(r)} is empty (every cell is missing) {hint}")
        column_name = feature_names[c] if c < len(feature_names) else label
        raise DataError(f"{path}: missing value in {body.where(r)}, column {column_name!r} {hint}")
    keep = ~bad_rows
    if not keep.any():
        raise DataError(f"{path}: every row has a missing value")
    if labels is not None:
        labels = [v for v, k in zip(labels, keep.tolist()) if k]
    return x[keep], labels, body.rows[keep], int(bad_rows.sum())


def _parse_column(column: tuple[str, ...], name: str, path: Path, body: _Body) -> np.ndarray:
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
                f"{path}: non-numeric value {text!r} in {body.where(i)}, column {name!r}"
            ) from None
    return out


def _check_float32(
    values: np.ndarray, column: tuple[str, ...], name: str, path: Path, body: _Body
) -> None:
    """Reject what float32 cannot hold: a cell beyond ±3.4e38, or a column whose mean overflows."""
    bad = np.isinf(values)  # NaN marks a missing cell, handled by the caller
    if bad.any():
        i = int(np.argmax(bad))
        raise DataError(
            f"{path}: value {column[i].strip()!r} in {body.where(i)}, column {name!r} overflows "
            "float32 (|x| > 3.4e38); rescale the column"
        )
    present = values[~np.isnan(values)]
    if not present.size:
        return
    with np.errstate(over="ignore", invalid="ignore"):
        mean = present.mean(dtype=np.float32)
    if not np.isfinite(mean):
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


def _check_printable(cells: list[str], path: Path, what: str, body: _Body | None = None) -> None:
    for i, cell in enumerate(cells):
        if any(ord(ch) < 32 or 127 <= ord(ch) < 160 for ch in cell):
            where = body.where(i) if body is not None else f"column {i}"
            raise DataError(
                f"{path}: control character in {what}, {where}: {cell!r}; labels and "
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

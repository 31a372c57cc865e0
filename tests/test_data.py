"""Tests for jaxwise.data and jaxwise.models: generators, CSV loading and its errors, the MLP."""

import warnings

import numpy as np
import pytest

from jaxwise.data import (
    DataError,
    flip_labels,
    load_csv,
    load_features,
    make_blobs,
    make_spiral,
    train_test_split,
)


def test_spiral_geometry():
    x, y = make_spiral(600, 3, 0.15, seed=0)
    assert x.shape == (1800, 2) and x.dtype == np.float32 and y.dtype == np.int32
    assert np.bincount(y).tolist() == [600, 600, 600]
    r = np.linalg.norm(x, axis=1)
    assert r.min() >= 0 and r.max() <= 1 + 1e-6
    # Noise-free arms follow angle 4j + 4r exactly.
    x0, y0 = make_spiral(50, 3, 0.0, seed=0)
    r0 = np.linalg.norm(x0, axis=1)
    theta = np.arctan2(x0[:, 0], x0[:, 1])
    expected = np.mod(4 * y0 + 4 * r0 + np.pi, 2 * np.pi) - np.pi
    ok = r0 > 1e-6
    np.testing.assert_allclose(np.cos(theta[ok] - expected[ok]), 1.0, atol=1e-5)
    np.testing.assert_array_equal(make_spiral(seed=3)[0], make_spiral(seed=3)[0])


def test_split_sizes_match_the_demo():
    x, y = make_spiral(600, 3, seed=0)
    xtr, xte, ytr, yte = train_test_split(x, y, test_fraction=0.2, seed=0)
    assert len(xtr) == 1440 and len(xte) == 360
    with pytest.raises(ValueError, match="same length"):
        train_test_split(x, y[:5])


def test_blobs_and_flips():
    x, y = make_blobs(2000, 20, 10, seed=0)
    assert x.shape == (2000, 20) and np.bincount(y).tolist() == [200] * 10
    noisy, idx = flip_labels(y, 20, 10, seed=1)
    assert len(idx) == 20 and (noisy[idx] != y[idx]).all() and (noisy != y).sum() == 20
    with pytest.raises(ValueError, match="n_flip"):
        flip_labels(y, 3000, 10)


def write(tmp_path, text, name="d.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_load_csv_string_and_integer_labels(tmp_path):
    table = load_csv(write(tmp_path, "f1,f2,colour\n1,2,red\n3, 4 ,blue\n5,6,red\n"), "colour")
    assert table.classes == ("blue", "red") and table.y.tolist() == [1, 0, 1]
    assert table.feature_names == ("f1", "f2") and table.x.dtype == np.float32
    np.testing.assert_array_equal(table.x, [[1, 2], [3, 4], [5, 6]])
    ints = load_csv(write(tmp_path, "label,a\n10,0.5\n2,1.5\n10,2\n", "i.csv"), "label")
    assert ints.classes == ("2", "10") and ints.y.tolist() == [1, 0, 1]


@pytest.mark.parametrize(
    "text, label, match",
    [
        ("", "y", "empty"),
        ("1,2,3\n4,5,6\n", "y", "no header"),
        ("a,b,y\n1,2,0\n", "target", "no label column 'target'; available columns: a, b, y"),
        (
            "a,b,y\n1,2,0\n3,x7,1\n",
            "y",
            r"non-numeric value 'x7' in data row 1 \(line 3\), column 'b'",
        ),
        ("a,b,y\n1,2,0\n3,,1\n", "y", r"missing value in data row 1 \(line 3\), column 'b'"),
        ("a,b,y\n1,2,0\n3,NaN,1\n", "y", "missing value in data row 1"),
        ("a,b,y\n1,2,0\n3,4,0\n", "y", "single class"),
        ("a,b,y\n", "y", "no data rows"),
        ("a,b,y\n1,2\n", "y", r"data row 0 \(line 2\) has 2 cells"),
        ("a,a,y\n1,2,0\n", "y", "duplicate column"),
        ("a,b,y\n1,inf,0\n2,3,1\n", "y", "non-finite"),
    ],
)
def test_load_csv_errors(tmp_path, text, label, match):
    with pytest.raises(DataError, match=match):
        load_csv(write(tmp_path, text), label)


def test_load_csv_missing_file_and_drop_na(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_csv(tmp_path / "nope.csv", "y")
    with pytest.raises(DataError, match="is a directory"):
        load_csv(tmp_path, "y")
    table = load_csv(write(tmp_path, "a,y\n1,0\n,1\n3,1\n4,na\n5,0\n"), "y", drop_na=True)
    assert (
        table.dropped == 2
        and table.rows.tolist() == [0, 2, 4]
        and table.x[:, 0].tolist() == [1, 3, 5]
    )
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"a,y\n\xff\xfe,1\n")
    with pytest.raises(DataError, match="UTF-8"):
        load_csv(binary, "y")


def test_load_csv_large_file_without_compiling(tmp_path):
    from jaxwise.compilation import CompileCounter

    n = 100_000
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 5)).round(4)
    labels = rng.choice(["a", "b", "c"], size=n)
    path = tmp_path / "big.csv"
    lines = ["f0,f1,f2,f3,f4,label"] + [
        ",".join(map(str, row)) + f",{lab}" for row, lab in zip(x.tolist(), labels)
    ]
    path.write_text("\n".join(lines) + "\n")
    with CompileCounter() as counter:
        table = load_csv(path, "label")
    assert counter.count == 0  # pure NumPy: nothing compiles per row (or at all)
    assert table.x.shape == (n, 5) and table.classes == ("a", "b", "c")
    np.testing.assert_allclose(table.x, x, rtol=1e-6)


def test_numeric_labels_are_normalised(tmp_path):
    table = load_csv(write(tmp_path, "a,y\n1,1\n2,1.0\n3,01\n4,0\n5,1e0\n6,0.50\n"), "y")
    assert table.classes == ("0", "0.5", "1") and table.y.tolist() == [2, 2, 2, 0, 2, 1]
    strings = load_csv(write(tmp_path, "a,y\n1,cat\n2,Cat\n3,cat \n", "s.csv"), "y")
    assert strings.classes == ("Cat", "cat")  # strings are kept as written (outer spaces stripped)


@pytest.mark.parametrize(
    "text, match",
    [
        (
            "a,y\n1,0\n1e39,1\n",
            r"value '1e39' in data row 1 \(line 3\), column 'a' overflows float32",
        ),
        (
            "a,y\n-1e39,0\n2,1\n",
            r"value '-1e39' in data row 0 \(line 2\), column 'a' overflows float32",
        ),
        ("a,y\n3e38,0\n3e38,1\n", "float32 mean overflows"),
        ("a,y\n-3e38,0\n-3e38,1\n", "float32 mean overflows"),
        ("a,y\n1,cat\n2,d\x00g\n", r"control character in label column 'y', data row 1 \(line 3\)"),
        ("a\x1b[31m,y\n1,0\n2,1\n", "control character in the header"),
        ("1,2,cat\n3,4,dog\n", "no header row"),
    ],
)
def test_load_csv_rejects_garbage(tmp_path, text, match):
    with pytest.raises(DataError, match=match):
        load_csv(write(tmp_path, text), "y")


def test_large_but_representable_values_load(tmp_path):
    table = load_csv(write(tmp_path, "a,y\n1e30,0\n-1e30,1\n3e38,0\n"), "y")
    assert np.isfinite(table.x).all() and table.x.dtype == np.float32


def test_load_features(tmp_path):
    from jaxwise.data import load_features

    path = write(tmp_path, "b,y,a\n2,cat,1\n4,1.0,3\n")
    got = load_features(path, ("a", "b"), label="y")
    assert got.x.tolist() == [[1, 2], [3, 4]] and got.labels == ("cat", "1")
    assert (
        load_features(write(tmp_path, "a,b\n1,2\n", "n.csv"), ("a", "b"), label="y").labels is None
    )
    with pytest.raises(DataError, match=r"missing feature column\(s\) 'b'"):
        load_features(write(tmp_path, "a,y\n1,0\n", "m.csv"), ("a", "b"), label="y")
    with pytest.raises(DataError, match=r"unexpected column\(s\) 'c'"):
        load_features(write(tmp_path, "a,b,c\n1,2,3\n", "e.csv"), ("a", "b"))
    with pytest.raises(DataError, match="no header row"):
        load_features(write(tmp_path, "1,2\n3,4\n", "h.csv"), ("a", "b"))


def test_load_csv_refuses_devices_and_fifos(tmp_path):
    import os

    with pytest.raises(DataError, match="not a regular file"):
        load_csv("/dev/zero", "y")
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(DataError, match="not a regular file"):
        load_csv(fifo, "y")


# ---------------------------------------------------------------------------
# Every data row accounted for: `rows` is the file's own numbering (pandas .iloc)
# ---------------------------------------------------------------------------

MESSY = (
    "id,a,kind\n"
    "0,1.5,ant\n"  # data row 0
    "\n"  # 1: a blank line
    "2,,bee\n"  # 2: a missing cell
    ",,\n"  # 3: every cell empty
    '4,"2.5\n",cat\n'  # 4: a quoted cell spanning two lines
    "   \n"  # 5: a blank line (spaces)
    '6,3.0,"bee"\n'  # 6
    "7,NA,ant\n"  # 7: a missing cell
    "8,1,cat\n"  # 8
    "\n"  # 9: a blank line at the end
)


def test_rows_are_the_files_own_numbering_like_pandas_iloc(tmp_path):
    import pandas as pd

    path = tmp_path / "messy.csv"
    path.write_text(MESSY)
    table = load_csv(path, "kind", drop_na=True)
    assert table.rows.tolist() == [0, 4, 6, 8]
    assert (table.dropped, table.blank_lines) == (3, 3)
    frame = pd.read_csv(path, skip_blank_lines=False)
    assert len(frame) == 10  # pandas counts every data row, blank lines included
    for i, row in enumerate(table.rows):
        assert float(frame.iloc[row]["id"]) == table.x[i, 0]
        assert frame.iloc[row]["kind"] == table.classes[table.y[i]]
    features = load_features(path, ("id", "a"), label="kind", drop_na=True)
    assert features.rows.tolist() == [0, 4, 6, 8]
    assert features.labels is not None
    assert [frame.iloc[r]["kind"] for r in features.rows] == list(features.labels)


@pytest.mark.parametrize(
    "text, match",
    [
        (MESSY, r"missing value in data row 2 \(line 4\), column 'a' \(3 rows have missing"),
        (
            "a,b,kind\n1,2,x\n,,\n3,4,y\n",
            r"data row 1 \(line 3\) is empty \(every cell is missing\)",
        ),
        ("a,b,kind\n1,2,x\n\n , ,\n3,4,y\n", r"data row 2 \(line 4\) is empty"),
        ('a,b,kind\n"1\n",2,x\n3,oops,y\n', r"non-numeric value 'oops' in data row 1 \(line 4\)"),
    ],
)
def test_an_empty_row_is_an_error_naming_its_row_and_line(tmp_path, text, match):
    path = tmp_path / "d.csv"
    path.write_text(text)
    with pytest.raises(DataError, match=match):
        load_csv(path, "kind")


def test_an_all_missing_column_is_one_error_and_no_numpy_warning(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,kind\n1,,x\n2,NA,y\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a NumPy RuntimeWarning would fail here
        for drop_na in (False, True):
            with pytest.raises(DataError, match=r"column 'b' has no values \(all 2 cells"):
                load_csv(path, "kind", drop_na=drop_na)


def test_a_symlink_loop_is_named_as_such(tmp_path):
    (tmp_path / "a.csv").symlink_to(tmp_path / "b.csv")
    (tmp_path / "b.csv").symlink_to(tmp_path / "a.csv")
    with pytest.raises(DataError, match="a.csv: a symlink loop"):
        load_csv(tmp_path / "a.csv", "kind")
    (tmp_path / "c.csv").symlink_to(tmp_path / "gone.csv")
    with pytest.raises(DataError, match=r"c.csv: a broken symlink \(to .*gone.csv"):
        load_features(tmp_path / "c.csv", ("a",))

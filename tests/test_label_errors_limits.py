"""find_label_errors and confident_learning refuse what they cannot do, before any training."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from jaxwise import label_errors as le
from jaxwise.label_errors import _find


class _Reached(Exception):
    """Raised instead of training: the call got past every check."""


@pytest.fixture
def no_training(monkeypatch: pytest.MonkeyPatch) -> None:
    def run_folds(*args: object, **kwargs: object) -> None:
        raise _Reached

    monkeypatch.setattr(_find, "run_folds", run_folds)


def _rows(labels: list[int], per_class: int) -> tuple[np.ndarray, np.ndarray]:
    y = np.repeat(np.asarray(labels, np.int32), per_class)
    x = np.random.default_rng(0).normal(size=(y.size, 3)).astype(np.float32)
    return x, y


def test_a_huge_num_classes_is_refused_before_training(no_training: None) -> None:
    x, y = _rows([0, 1, 2], 20)  # 60 rows: this call ran for minutes before
    with pytest.raises(ValueError, match=r"`num_classes`=1,000,000 is far beyond the labels"):
        le.find_label_errors(x, y, num_classes=10**6)
    with pytest.raises(ValueError, match=r"at most 67 for these labels"):
        le.find_label_errors(x, y, num_classes=68)
    with pytest.raises(_Reached):  # the largest accepted count goes on to train
        le.find_label_errors(x, y, num_classes=67)


def test_num_classes_needing_too_much_memory_is_refused(no_training: None) -> None:
    y = np.arange(20_000, dtype=np.int32) * 2  # labels up to 39,998, one row each
    x = np.zeros((y.size, 1), np.float32)
    with pytest.raises(ValueError, match=r"`num_classes`=40,000 with 20,000 rows.*GiB"):
        le.find_label_errors(x, y, num_classes=40_000)


def test_labels_that_skip_classes_warn_once(no_training: None) -> None:
    x, y = _rows([0, 2, 5], 6)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(_Reached):
            le.find_label_errors(x, y)
    assert [str(w.message)[:48] for w in caught] == [
        "the labels skip 3 of the classes 0..5 (no row ha"
    ]
    assert "no row has 1, 3, 4" in str(caught[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit num_classes says it is intended
        with pytest.raises(_Reached):
            le.find_label_errors(x, y, num_classes=6)


def test_folds_above_the_smallest_class_are_refused(no_training: None) -> None:
    x, y = _rows([0, 1], 10)
    x, y = x[:13], y[:13]  # class 1 has 3 rows
    with pytest.raises(
        ValueError, match=r"`Folds.n_splits`=5 is more than the 3 row\(s\) of class 1.* pass `Folds"
    ):
        le.find_label_errors(x, y)
    with pytest.raises(ValueError, match=r"`Folds.n_splits`=4"):
        le.find_label_errors(x, y, folds=le.Folds(4))
    with pytest.raises(_Reached):
        le.find_label_errors(x, y, folds=le.Folds(3), training=le.Training(batch_size=4))


@pytest.mark.parametrize("fn", [le.confident_learning, le.label_quality])
def test_rows_must_be_probabilities(fn) -> None:
    labels = np.array([0, 1, 1])
    scores = np.array([[0.6, 0.6], [0.2, 0.8], [0.5, 0.5]])
    with pytest.raises(ValueError, match=r"rows must sum to 1 .*1 of 3 do not, e\.g\. row 0"):
        fn(scores, labels)
    with pytest.raises(ValueError, match="sum to 1"):
        fn(np.array([[0.1, 0.1], [0.2, 0.3], [0.0, 0.0]]), labels)
    nearly = np.array([[0.6, 0.4 + 5e-4], [0.2, 0.8], [0.5, 0.5 - 5e-4]])  # float32 rounding
    fn(nearly, labels)

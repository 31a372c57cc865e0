"""Data generated in code (spiral, blobs, label noise) and users' CSV files.

Generators use NumPy's seeded ``Generator`` (no JAX compilation, identical
on every machine for a given seed).

Examples:
    >>> x, y = make_spiral(seed=0)
    >>> x.shape, x.dtype, y.dtype, sorted(set(y.tolist()))
    ((1800, 2), dtype('float32'), dtype('int32'), [0, 1, 2])
"""

from jaxwise._shared._prefetch import Prefetcher, prefetch_to_device
from jaxwise.data._csv import DataError, Features, Table, load_csv, load_features
from jaxwise.data._synthetic import flip_labels, make_blobs, make_spiral, train_test_split

__all__ = [
    "DataError",
    "Features",
    "Prefetcher",
    "Table",
    "flip_labels",
    "load_csv",
    "load_features",
    "make_blobs",
    "make_spiral",
    "prefetch_to_device",
    "train_test_split",
]

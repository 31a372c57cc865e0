"""Bucketed padding and ahead-of-time compiled serving.

A jitted function compiles once per input shape, so serving requests of variable length with plain
``jit`` pays a compile for every new length. Padding every request up to one of a few *bucket* sizes
bounds the number of programs; [`plan_buckets`][jaxwise.buckets.plan_buckets] chooses the buckets
that minimise the padded work for an observed length histogram, and
[`BucketedFunction`][jaxwise.buckets.BucketedFunction] compiles every bucket ahead of time so that
no request ever compiles.

The helpers here ([`bucket_for`][jaxwise.buckets.bucket_for],
[`pad_to_bucket`][jaxwise.buckets.pad_to_bucket], [`plan_buckets`][jaxwise.buckets.plan_buckets],
[`padding_waste`][jaxwise.buckets.padding_waste]) are pure NumPy and never trigger a JAX
compilation.

Examples:
    >>> import numpy as np
    >>> padded, mask = pad_to_bucket(np.arange(5.0), (4, 8, 16))
    >>> padded.shape, int(mask.sum())
    ((8,), 5)
"""

from jaxwise.buckets._padding import bucket_for as bucket_for
from jaxwise.buckets._padding import pad_to_bucket as pad_to_bucket
from jaxwise.buckets._padding import padding_waste as padding_waste
from jaxwise.buckets._padding import power_of_two_buckets as power_of_two_buckets
from jaxwise.buckets._plan import plan_buckets as plan_buckets
from jaxwise.buckets._serve import BucketedFunction as BucketedFunction
from jaxwise.buckets._serve import BucketStats as BucketStats
from jaxwise.buckets._serve import Padded as Padded

__all__ = [
    "BucketStats",
    "BucketedFunction",
    "Padded",
    "bucket_for",
    "pad_to_bucket",
    "padding_waste",
    "plan_buckets",
    "power_of_two_buckets",
]

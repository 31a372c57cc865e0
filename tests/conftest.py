"""Test configuration: strict dtype promotion, 8 fake CPU devices, key fixtures.

Equinox-style strict dtype promotion, so that our library never relies on
implicit promotion (peer libraries that do — Optax — are called under
``jax.numpy_dtype_promotion("standard")`` in the tests); warnings are errors
(pyproject). Rank promotion (``x @ w + b``) is allowed: it is idiomatic.
"""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import jax
import numpy as np
import pytest

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")

pytest_plugins = ["pytester"]
collect_ignore_glob = ["lint_cases/*"]  # source snippets for the linter, never imported


@pytest.fixture
def key():
    """A fresh typed PRNG key."""
    return jax.random.key(0)


@pytest.fixture
def rng():
    """A seeded NumPy generator for float64 reference data."""
    return np.random.default_rng(0)

"""Test configuration: strict JAX numerics, 8 fake CPU devices, a key fixture.

Equinox-style: strict dtype promotion and rank promotion errors so that our
library never relies on implicit promotion; warnings are errors (pyproject).
"""

import os

os.environ.setdefault("MPLBACKEND", "Agg")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)
jax.config.update("jax_numpy_dtype_promotion", "strict")
jax.config.update("jax_numpy_rank_promotion", "raise")

pytest_plugins = ["pytester"]


@pytest.fixture
def key():
    """A fresh typed PRNG key."""
    return jax.random.key(0)


@pytest.fixture
def rng():
    """A seeded NumPy generator for float64 reference data."""
    return np.random.default_rng(0)

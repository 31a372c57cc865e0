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


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs(size)``: a tmpfs of ``size`` (e.g. ``"4m"``) mounted at ``tmp_path/disk``.

    A real full disk: skips unless running as root with ``mount`` available; unmounted after
    the test.
    """
    import subprocess

    mounted = []

    def mount(size):
        if os.geteuid() != 0:
            pytest.skip("mounting a tmpfs needs root (the fault-injecting tests run anyway)")
        path = tmp_path / "disk"
        path.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
        )
        if proc.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=True)

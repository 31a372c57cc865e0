"""Test configuration: strict dtype promotion, 8 CPU devices, float64 on the host, fixtures.

Equinox-style strict dtype promotion, so that our library never relies on
implicit promotion (peer libraries that do — Optax — are called under
``jax.numpy_dtype_promotion("standard")`` in the tests); warnings are errors
(pyproject). Rank promotion (``x @ w + b``) is allowed: it is idiomatic.
"""

import os
import signal

os.environ.setdefault("MPLBACKEND", "Agg")

# Ctrl-C tests send SIGINT. A runner that starts the suite in the background (a shell's `&`)
# ignores SIGINT, Python then keeps it ignored and every child inherits that: restore Python's
# handler, so the worker and the programs it starts receive SIGINT as at a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

import jax
import numpy as np
import pytest

jax.config.update("jax_num_cpu_devices", 8)  # `jax.devices("cpu")`, whatever the backend
jax.config.update("jax_numpy_dtype_promotion", "strict")

# Float64 referees run on the host: `jax.enable_x64(True)` fails a test whose default device
# is not a CPU (a TPU has no native float64); `host64.host_float64()` is the way to do it.
import host64  # noqa: E402  (tests/ is on sys.path: conftest's directory)

host64.install_guard()

# The suite checks arithmetic (against float64, Optax, a second code path) at float32 matmul
# precision: on an accelerator, "highest" (a TPU's default is one bfloat16 pass, ~3 digits);
# a no-op on CPU. Tests of the backend's own default ask for it: `backend_default_precision`.
if jax.default_backend() != "cpu":
    jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture
def backend_default_precision():
    """The backend's default matmul precision for the test (undoes the accelerator's "highest")."""
    saved = jax.config.jax_default_matmul_precision
    jax.config.update("jax_default_matmul_precision", None)
    yield
    jax.config.update("jax_default_matmul_precision", saved)


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


@pytest.fixture
def inner_pytest_args(request):
    """Arguments for an inner (pytester) run that loads what this run loaded.

    jaxwise's plugin by name where jaxwise is not installed (a checkout on PYTHONPATH has no
    ``pytest11`` entry point); Hypothesis' plugin off where this run has it off (the TPU lane:
    loading it after Hypothesis was imported fails).
    """
    from importlib.metadata import entry_points

    args = ["-p", "no:cacheprovider"]
    if not any(ep.value == "jaxwise.pytest_plugin" for ep in entry_points(group="pytest11")):
        args += ["-p", "jaxwise.pytest_plugin"]
    if request.config.pluginmanager.is_blocked("hypothesispytest"):
        args += ["-p", "no:hypothesispytest"]
    return args

"""``jaxwise doctor``: the installed JAX, its devices, and live checks of known pitfalls.

Each check *runs* the pitfall on the installed JAX instead of trusting a
version table, and reports ``PASS`` (the pitfall does not bite here) or
``WARN`` (it does, with what to do about it). A backend that cannot start (a TPU held by
another process, no libtpu) is a ``FAIL`` that names the backend and why; the versions and
the checks that need no device are still reported.

Examples:
    >>> check_captured_constant(n=64).status
    'PASS'
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import json
import os
import platform
import re
import subprocess
import sys
import textwrap
import warnings
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from jaxwise._shared._buffers import donated_buffers, kept
from jaxwise._shared._checks import check_int
from jaxwise._shared._extras import require
from jaxwise._shared._jax import NEWEST_TESTED_JAX, OLDEST_TESTED_JAX, jax_version

__all__ = [
    "ECOSYSTEM",
    "Check",
    "check_captured_constant",
    "check_debug_nans_after_vmap",
    "check_numpy_view_donation",
    "check_tested_jax",
    "backend_error",
    "environment",
    "failure",
    "render",
    "report",
    "run_checks",
]


@dataclasses.dataclass(frozen=True)
class Check:
    """The outcome of one pitfall check."""

    name: str
    status: Literal["PASS", "WARN", "FAIL"]
    detail: str


# Libraries jaxwise works with: their installed versions are part of every bug report.
# (distribution name, whether it is listed even when absent).
ECOSYSTEM = (
    ("optax", True),
    ("flax", True),
    ("orbax-checkpoint", True),
    ("dp-accounting", True),
    ("equinox", False),
)


def _distribution_version(name: str) -> str | None:
    """The installed version of a distribution, read from its metadata (nothing imported)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# What a backend's matrix products compute at JAX's default precision, and whether it has
# native float64 arithmetic (a TPU emulates none: float64 there is an error or a crash).
_BACKEND_PRECISION = {
    "cpu": ("full float32", True),
    "gpu": ("TF32 on Ampere and newer, else full float32", True),
    "tpu": ("one bfloat16 pass (about 3 digits)", False),
}


def matmul_precision(backend: str | None = None) -> str:
    """The default matmul precision in force: JAX's ``jax_default_matmul_precision`` when set,
    else what ``backend`` (default: JAX's default backend) computes at its default.

    Examples:
        >>> with jax.default_matmul_precision(None):  # nothing configured
        ...     matmul_precision("cpu")
        'default: full float32'
        >>> with jax.default_matmul_precision("highest"):
        ...     matmul_precision("tpu")
        'highest (jax_default_matmul_precision)'
    """
    configured = jax.config.jax_default_matmul_precision  # pyright: ignore[reportAttributeAccessIssue]
    if configured is not None:
        return f"{configured} (jax_default_matmul_precision)"
    what, _ = _BACKEND_PRECISION.get(backend or jax.default_backend(), ("backend-defined", False))
    return f"default: {what}"


def float64_native(backend: str | None = None) -> bool:
    """Whether ``backend`` (default: JAX's default backend) computes float64 natively.

    Examples:
        >>> float64_native("cpu"), float64_native("tpu")
        (True, False)
    """
    return _BACKEND_PRECISION.get(backend or jax.default_backend(), ("", False))[1]


# JAX's devices, read through this name so that a test can inject a backend that fails to start.
_devices = jax.devices

# libtpu's advice when its lock file is in use ("Run \"$ sudo rm /tmp/libtpu_lockfile\"."):
# harmful while another process (a training job) legitimately holds the chip.
_LOCK_ADVICE = re.compile(
    r"(?:\bRun\s+)?\"?\$?\s*(?:sudo\s+)?\brm\s+(?:-\w+\s+)*[^\s\"]*lock[^\s\"]*\"?\.?\s*",
    re.IGNORECASE,
)
_HELD_SIGNS = ("lockfile", "already in use", "resource busy")
_HELD = (
    "held by another process (one process at a time opens a TPU): wait for it to end or stop "
    "it; never delete libtpu's lock file while it runs"
)


def _why_backend_failed(message: str) -> str:
    """A one-line reason from JAX's backend error, without libtpu's advice to delete its lock."""
    line = " ".join(message.split())
    cleaned = re.sub(r"^Unable to initialize backend '[^']+':\s*", "", _LOCK_ADVICE.sub("", line))
    cleaned = cleaned.strip()
    if any(sign in line.lower() for sign in _HELD_SIGNS):
        return f"{_HELD} ({cleaned})"
    if "libtpu" in line and ("Failed to open" in line or "cannot open" in line):
        return f"libtpu is not installed or cannot be loaded ({cleaned})"
    return cleaned


def backend_error() -> tuple[str, str] | None:
    """``(backend, why)`` when JAX's backend cannot start, else ``None`` (the devices are up).

    ``why`` is one line: libtpu's advice to delete its lock file is left out (a TPU held by
    another process is named as such).

    Examples:
        >>> backend_error() is None  # this machine's backend starts
        True
    """
    try:
        _devices()
    except RuntimeError as err:
        message = str(err)
        named = re.search(r"backend '([^']+)'", message)
        configured = jax.config.jax_platforms or "default"  # pyright: ignore[reportAttributeAccessIssue]
        return (named.group(1) if named else configured), _why_backend_failed(message)
    return None


def _versions() -> dict[str, str | bool]:
    """Python, JAX, jaxlib, NumPy and the ecosystem's versions (package metadata only)."""
    env: dict[str, str | bool] = {
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _distribution_version("jaxlib") or "not installed",
        "numpy": np.__version__,
    }
    for name, always in ECOSYSTEM:
        version = _distribution_version(name)
        if version is not None or always:
            env[name] = version or "not installed"
    return env


def environment() -> dict[str, str | bool]:
    """Python, JAX, jaxlib and ecosystem versions, backend, device kind, the default matmul
    precision and whether float64 is native.

    Lists optax, flax, orbax-checkpoint and dp-accounting (``"not installed"`` when absent)
    and equinox when installed; versions come from package metadata, nothing is imported.
    When the backend cannot start (`backend_error`), the versions, ``backend`` (the one that
    failed), ``backend_error`` (why) and ``platform``.

    Examples:
        >>> env = environment()
        >>> sorted(env)[:3], "optax" in env and "orbax-checkpoint" in env
        (['backend', 'device_kind', 'devices'], True)
        >>> env["float64_native"] if env["backend"] == "cpu" else True
        True
    """
    env = _versions()
    host = f"{platform.system()} {platform.machine()}"
    failed = backend_error()
    if failed is not None:
        backend, why = failed
        env.update({"backend": backend, "backend_error": why, "platform": host})
        return env
    devices = _devices()
    kinds = sorted({d.device_kind for d in devices})
    env.update(
        {
            "backend": jax.default_backend(),
            "device_kind": devices[0].device_kind,
            "devices": f"{len(devices)} × {', '.join(kinds)}",
            "matmul_precision": matmul_precision(),
            "float64_native": float64_native(),
            "platform": host,
        }
    )
    return env


_DEBUG_NANS_PROBE = textwrap.dedent(
    """
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x: jnp.log(x))
    f(jnp.ones(3)).block_until_ready()          # compiled before the flag is set
    jax.vmap(lambda x: 2 * x)(jnp.ones(3))      # any vmap anywhere in the process
    jax.config.update("jax_debug_nans", True)
    try:
        f(-jnp.ones(3)).block_until_ready()
        print("MISSED")
    except FloatingPointError:
        print("CAUGHT")
    """
)


def check_debug_nans_after_vmap(isolated: bool = True) -> Check:
    """Does ``jax_debug_nans`` catch a NaN in an already-compiled function after a ``vmap``?

    Runs in a fresh interpreter (``isolated=True``) because the pitfall depends
    on what already ran in the process; off a CPU, that interpreter runs on the CPU
    (``JAX_PLATFORMS=cpu``): a TPU opens in one process at a time, this one (the pitfall is in
    JAX's dispatch, the same on every backend).
    """
    name = "debug_nans after vmap"
    if isolated:
        env = dict(os.environ)
        if jax.default_backend() != "cpu":
            env["JAX_PLATFORMS"] = "cpu"
        proc = subprocess.run(
            [sys.executable, "-c", _DEBUG_NANS_PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
        outcome = (
            proc.stdout.strip().splitlines()[-1]
            if proc.stdout.strip()
            else f"ERROR {proc.stderr[-200:]}"
        )
    else:
        namespace: dict[str, object] = {}
        from contextlib import redirect_stdout
        from io import StringIO

        buffer = StringIO()
        before = jax.config.jax_debug_nans
        try:
            with redirect_stdout(buffer):
                exec(_DEBUG_NANS_PROBE, namespace)
        finally:
            jax.config.update("jax_debug_nans", before)
        outcome = buffer.getvalue().strip()
    if outcome == "CAUGHT":
        return Check(name, "PASS", "jax_debug_nans still checks compiled functions after a vmap")
    return Check(
        name,
        "WARN",
        "jax_debug_nans silently stops checking already-compiled jit functions once vmap ran in "
        "the process; call jax.clear_caches() after enabling it, or use jaxwise.debug.locate_nan "
        "(an equation-by-equation replay that needs no flag)",
    )


@functools.partial(jax.jit, donate_argnums=0)
def _donating_increment(x: jax.Array) -> jax.Array:
    return x + 1.0


@jax.jit
def _tanh_matvec(m: jax.Array, v: jax.Array) -> jax.Array:
    return jnp.tanh(m @ v)


def check_numpy_view_donation() -> Check:
    """Does a live ``np.asarray`` view of a CPU array silently disable its donation?"""
    name = "np.asarray and donation"
    if jax.default_backend() != "cpu":
        return Check(
            name, "PASS", f"not applicable on {jax.default_backend()} (no zero-copy host views)"
        )
    x = jnp.arange(1024.0)
    view = np.asarray(x)  # noqa: JW011 - the pitfall this check demonstrates
    before = donated_buffers([x])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = _donating_increment(x).block_until_ready()
    donated = not kept([x], before, out)  # deleted (any JAX) and its buffer reused (>= 0.12.1)
    del view
    if donated:
        return Check(
            name, "PASS", "donation happens even while a NumPy view of the buffer is alive"
        )
    warned = any("donated" in str(w.message) for w in caught)
    how = "with a warning" if warned else "without any warning"
    return Check(
        name,
        "WARN",
        f"a live np.asarray view keeps the buffer: donation was skipped {how} (peak memory "
        "doubles); keep host copies with np.array(x, copy=True) / jaxwise.tree.host_copy",
    )


def check_captured_constant(n: int = 256) -> Check:
    """Does a matrix captured in a jitted closure give the argument version's result?

    Both are compared with a NumPy float64 reference; the closure embeds the
    matrix in the program, which this check also reports.
    """
    n = check_int(n, "n", min_value=1)
    name = "captured constant"
    rng = np.random.default_rng(0)
    a = rng.normal(size=(n, n)).astype(np.float32) / np.sqrt(n)
    x = rng.normal(size=(n,)).astype(np.float32)
    a_dev, x_dev = jnp.asarray(a), jnp.asarray(x)
    closure = jax.jit(lambda v: jnp.tanh(a_dev @ v))  # the pitfall under test: `a_dev` is captured
    got_closure = np.asarray(closure(x_dev), np.float64)  # noqa: JW001 - a fresh closure is the point here
    got_argument = np.asarray(_tanh_matvec(a_dev, x_dev), np.float64)
    reference = np.tanh(a.astype(np.float64) @ x.astype(np.float64))
    err_closure = float(np.max(np.abs(got_closure - reference)))
    err_argument = float(np.max(np.abs(got_argument - reference)))
    size_closure = len(closure.lower(x_dev).as_text())
    size_argument = len(_tanh_matvec.lower(a_dev, x_dev).as_text())
    sizes = (
        f"program text {size_closure / 1024:.0f} KiB vs {size_argument / 1024:.0f} KiB as argument"
    )
    if np.array_equal(got_closure, got_argument):
        embedded = size_closure > 2 * size_argument  # JAX >= 0.12.1 hoists it to an argument
        how = "still, the constant is embedded" if embedded else "JAX passes it as an argument"
        return Check(
            name,
            "PASS",
            f"same result as passing it as an argument (max error vs float64 {err_argument:.1e}); "
            f"{how}: {sizes}",
        )
    return Check(
        name,
        "WARN",
        f"captured constant changes the result: max error vs float64 {err_closure:.1e} "
        f"(closure) vs {err_argument:.1e} (argument); {sizes}; pass arrays as arguments",
    )


def check_tested_jax(version: str | None = None) -> Check:
    """Whether the JAX ``version`` (default: the installed one) lies in the tested range.

    A JAX newer than the newest that CI tests is a note (``WARN``), not an error: jaxwise
    reads JAX's internals in one module that may need an update for it.

    Examples:
        >>> check_tested_jax("0.99.0").status, check_tested_jax(OLDEST_TESTED_JAX).status
        ('WARN', 'PASS')
    """
    version = version or jax.__version__
    tested = f"tested: JAX {OLDEST_TESTED_JAX} to {NEWEST_TESTED_JAX}"
    if jax_version(version) > jax_version(NEWEST_TESTED_JAX):
        detail = (
            f"JAX {version} is newer than the newest tested ({tested}); jaxwise should work, "
            "but recompile explanations read JAX internals that may have moved: please report "
            "what fails"
        )
        return Check("tested_jax", "WARN", detail)
    return Check("tested_jax", "PASS", f"JAX {version} ({tested})")


# The checks that run a computation: they need the backend to start.
DEVICE_CHECKS = ("debug_nans after vmap", "np.asarray and donation", "captured constant")


def check_backend(failed: tuple[str, str]) -> Check:
    """The ``FAIL`` of a backend that cannot start (`backend_error`): which, why, what is left."""
    backend, why = failed
    return Check(
        "backend",
        "FAIL",
        f"backend {backend!r} cannot start: {why}; not run (they need a device): "
        + ", ".join(DEVICE_CHECKS),
    )


def run_checks(isolated: bool = True, failed: tuple[str, str] | None = None) -> list[Check]:
    """Run every pitfall check and return the outcomes.

    With ``failed`` (`backend_error`'s answer), only the checks that need no device, after the
    backend's ``FAIL``.
    """
    if failed is not None:
        return [check_backend(failed), check_tested_jax()]
    return [
        check_tested_jax(),
        check_debug_nans_after_vmap(isolated),
        check_numpy_view_donation(),
        check_captured_constant(),
    ]


def report(as_json: bool = False) -> str:
    """The doctor's output: environment and checks as a table (or JSON)."""
    env = environment()
    return render(env, run_checks(failed=failure(env)), as_json)


def failure(env: dict[str, str | bool]) -> tuple[str, str] | None:
    """``(backend, why)`` from an `environment` whose backend could not start, else ``None``."""
    if "backend_error" not in env:
        return None
    return str(env["backend"]), str(env["backend_error"])


def render(env: dict[str, str | bool], checks: list[Check], as_json: bool = False) -> str:
    """``env`` (`environment`) and ``checks`` (`run_checks`) as tables, or as one JSON object."""
    if as_json:
        return json.dumps({"environment": env, "checks": [dataclasses.asdict(c) for c in checks]})
    from io import StringIO

    rich_console = require("rich.console", extra="cli", feature="jaxwise doctor (or --json)")
    rich_table = require("rich.table", extra="cli", feature="jaxwise doctor (or --json)")

    buffer = StringIO()
    console = rich_console.Console(file=buffer, width=120, force_terminal=False)
    env_table = rich_table.Table(title="jaxwise doctor", show_header=False)
    for key, value in env.items():
        env_table.add_row(key, str(value).lower() if isinstance(value, bool) else value)
    console.print(env_table)
    table = rich_table.Table(show_header=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("explanation")
    for c in checks:
        table.add_row(c.name, c.status, c.detail)
    console.print(table)
    return buffer.getvalue()

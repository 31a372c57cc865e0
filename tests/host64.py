"""The host in the tests: float64 referees on the CPU (and their guard), the devices of a mesh.

A TPU has no native float64 (XLA aborts compiling some float64 programs there), and a
float64 referee that runs on an accelerator checks the accelerator's emulation, not the
mathematics. Every test that runs JAX in float64 does it with ``with host_float64():`` —
float64 on, and the CPU device the default for the block — or in NumPy. The guard
(`install_guard`, called by ``conftest.py``) makes ``jax.enable_x64(True)`` fail the test
when the default device is not a CPU, so a referee written the old way fails on a TPU
with a message naming the fix rather than aborting the process; on a CPU-only machine it
never fires. A test's mesh takes its devices from `mesh_devices` (the default backend's if
it has enough of them, else the CPU's: a one-chip TPU machine has 8 CPU devices too).

Examples:
    >>> import jax.numpy as jnp
    >>> with host_float64() as cpu:
    ...     x = jnp.ones(3) / 3
    >>> x.dtype.name, x.devices() == {cpu}
    ('float64', True)
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import jax

__all__ = [
    "Float64OffHost",
    "cpu_devices",
    "default_platform",
    "host_default",
    "host_float64",
    "install_guard",
    "mesh_devices",
    "on_host",
    "set_x64",
]

# `jax.enable_x64` before `install_guard` wraps it (the State object: callable, `.value`).
_ENABLE_X64 = jax.enable_x64
# The default backend, read through this name so that a test can inject another one.
_backend = jax.default_backend


class Float64OffHost(AssertionError):
    """A float64 computation was about to run on a default device that is not a CPU."""


def cpu_devices() -> list[Any]:
    """The CPU devices (conftest configures 8), whatever the default backend is."""
    return jax.devices("cpu")


def mesh_devices(n: int) -> list[Any]:
    """``n`` devices for a test's mesh: the default backend's if it has ``n``, else the CPU's."""
    devices = jax.devices()
    return devices[:n] if len(devices) >= n else cpu_devices()[:n]


def default_platform() -> str:
    """The platform of the device that uncommitted work runs on now (``"cpu"``, ``"tpu"``, …)."""
    device = jax.config.jax_default_device
    if device is None:
        return _backend()
    return device if isinstance(device, str) else device.platform


@contextlib.contextmanager
def on_host() -> Iterator[Any]:
    """The block's uncommitted arrays and computations on the first CPU device (yielded)."""
    cpu = cpu_devices()[0]
    with jax.default_device(cpu):
        yield cpu


@contextlib.contextmanager
def host_default() -> Iterator[Any]:
    """Like `on_host`, but for every thread (a job compiles in a background thread).

    For a test that runs a whole job on the host: golden values recorded on XLA:CPU.
    """
    cpu, saved = cpu_devices()[0], jax.config.jax_default_device
    jax.config.update("jax_default_device", cpu)
    try:
        yield cpu
    finally:
        jax.config.update("jax_default_device", saved)


@contextlib.contextmanager
def host_float64() -> Iterator[Any]:
    """Float64 JAX for the block, on the first CPU device (yielded); never on an accelerator."""
    with on_host() as cpu, _ENABLE_X64(True):
        yield cpu


def check_on_host(what: str = "jax.enable_x64(True)") -> None:
    """Raise `Float64OffHost` unless the default device is a CPU."""
    platform = default_platform()
    if platform != "cpu":
        raise Float64OffHost(
            f"{what} with the default device on {platform!r}: a float64 referee must run "
            "on the host — use `with host_float64():` (tests/host64.py) or NumPy"
        )


def set_x64(enabled: bool) -> None:
    """Set JAX's float64 flag for the process (``jax_enable_x64``); on only from the host.

    For a test of the flip itself (a recompile that names the flag); a float64 computation uses
    `host_float64`.
    """
    if enabled:
        check_on_host("jax_enable_x64=True")
    jax.config.update("jax_enable_x64", enabled)


class _GuardedEnableX64:
    """``jax.enable_x64`` that checks the default device first when float64 is turned on."""

    def __call__(self, new_val: bool = True) -> Any:
        if new_val:
            check_on_host()
        return _ENABLE_X64(new_val)

    def __getattr__(self, name: str) -> Any:  # `.value` and the rest of the State object
        return getattr(_ENABLE_X64, name)


def install_guard() -> None:
    """Make ``jax.enable_x64(True)`` fail off the host (`check_on_host`); idempotent."""
    if not isinstance(jax.enable_x64, _GuardedEnableX64):
        jax.enable_x64 = _GuardedEnableX64()  # type: ignore[assignment]

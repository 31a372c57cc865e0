"""The float64 guard: a float64 referee never runs on a default device that is not a CPU.

The accelerator is injected (``host64._backend``), so that the guard is tested on CPU: the
way every referee in the suite runs float64 (`host64.host_float64`) passes it and moves the
work to the CPU device; ``jax.enable_x64(True)`` on the (injected) TPU fails the test.
"""

import host64
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import Float64OffHost, host_float64


@pytest.fixture
def on_a_tpu(monkeypatch):
    """The default backend reads as a TPU (the device placement itself stays the CPU's)."""
    monkeypatch.setattr(host64, "_backend", lambda: "tpu")
    assert host64.default_platform() == "tpu"


def test_enable_x64_on_an_accelerator_fails_the_test(on_a_tpu):
    with pytest.raises(Float64OffHost, match="'tpu'.*host_float64"):
        with jax.enable_x64(True):
            pytest.fail("the float64 block ran on the accelerator")


def test_host_float64_passes_the_guard_and_runs_on_the_cpu_device(on_a_tpu):
    cpu = jax.devices("cpu")[0]
    with host_float64() as device:
        assert device == cpu and host64.default_platform() == "cpu"
        with jax.enable_x64(True):  # nested, as a library under test may do: allowed here
            x = jnp.asarray(np.arange(4.0)) / 3
            y = jax.jit(lambda v: v * v)(x)
    assert x.dtype == y.dtype == jnp.float64
    assert x.devices() == y.devices() == {cpu}
    np.testing.assert_array_equal(np.asarray(y), (np.arange(4.0) / 3) ** 2)
    assert not jax.config.jax_enable_x64 and jax.config.jax_default_device is None


def test_the_guard_is_installed_and_transparent_on_the_host():
    assert isinstance(jax.enable_x64, host64._GuardedEnableX64)
    assert jax.enable_x64.value is False  # the State's attributes still read through
    with jax.enable_x64(False):  # turning float64 off is never refused
        pass
    if jax.default_backend() == "cpu":
        with jax.enable_x64(True):
            assert jnp.asarray(1.0).dtype == jnp.float64
    else:  # on the accelerator itself: the real guard, no injection
        with pytest.raises(Float64OffHost):
            with jax.enable_x64(True):
                pass


# Where float64 may be switched on: the helper, and the guard's own tests (which try it on an
# injected TPU to see it refused). Everything else goes through `host_float64` / `set_x64`.
X64_ALLOWED = {"tests/host64.py", "tests/test_host64.py"}


def _x64_switches(source: str) -> list[int]:
    """Lines of ``source`` switching float64: ``enable_x64(…)``, ``update("jax_enable_x64", …)``."""
    import ast

    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0] if node.args else None
        if name == "enable_x64" or (
            name == "update"
            and isinstance(first, ast.Constant)
            and str(first.value).lower() == "jax_enable_x64"
        ):
            lines.append(node.lineno)
    return sorted(lines)


def test_float64_is_switched_on_only_through_the_host_helper():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    found = {
        f"{path.relative_to(root)}:{line}"
        for folder in ("src", "tests")
        for path in sorted((root / folder).rglob("*.py"))
        if str(path.relative_to(root)) not in X64_ALLOWED and "lint_cases" not in path.parts
        for line in _x64_switches(path.read_text())
    }
    assert not found, f"float64 switched on outside tests/host64.py (use host_float64): {found}"


def test_the_float64_scan_finds_each_form():
    source = (
        "import jax\n"
        "with jax.enable_x64(True):\n    pass\n"
        "jax.config.update('jax_enable_x64', True)\n"
        "from jax.experimental import enable_x64\n"
        "enable_x64()\n"
        "jax.config.update('jax_default_device', None)\n"
        "jax.config.update('JAX_ENABLE_X64', False)\n"
    )
    assert _x64_switches(source) == [2, 4, 6, 8]

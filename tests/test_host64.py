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

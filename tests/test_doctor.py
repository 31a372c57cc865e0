"""Tests for jaxwise._doctor (`jaxwise doctor`): the live pitfall checks and the command."""

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from jaxwise import _doctor as doctor


def test_doctor_checks_reproduce_the_known_pitfalls():
    checks = {c.name: c for c in doctor.run_checks()}
    # JAX 0.10.2-0.12.1 on CPU: both pitfalls are real here (the donation one changed form in
    # 0.12.1: the array is deleted, the view keeps its buffer); a newer JAX may fix them.
    assert checks["debug_nans after vmap"].status == "WARN"
    assert checks["np.asarray and donation"].status == "WARN"
    assert checks["captured constant"].status == "PASS"
    assert "KiB" in checks["captured constant"].detail


def test_doctor_in_process_probe_restores_flag():
    import jax

    check = doctor.check_debug_nans_after_vmap(isolated=False)
    assert check.status in ("PASS", "WARN")
    assert jax.config.jax_debug_nans is False


def test_doctor_command_json():
    proc = subprocess.run(
        [sys.executable, "-m", "jaxwise.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["environment"]["jax"] == importlib.metadata.version("jax")
    assert {c["status"] for c in report["checks"]} <= {"PASS", "WARN"}
    assert len(report["checks"]) == 4
    assert report["checks"][0]["name"] == "tested_jax"
    env = report["environment"]
    for name in ("optax", "flax", "orbax-checkpoint", "dp-accounting", "equinox"):
        assert env[name] == importlib.metadata.version(name), name


def test_environment_lists_ecosystem_versions(monkeypatch):
    env = doctor.environment()
    assert env["optax"] == importlib.metadata.version("optax")
    assert env["orbax-checkpoint"] == importlib.metadata.version("orbax-checkpoint")
    assert env["dp-accounting"] == importlib.metadata.version("dp-accounting")
    assert env["jaxlib"] == importlib.metadata.version("jaxlib")

    real = doctor._distribution_version
    monkeypatch.setattr(
        doctor, "_distribution_version", lambda n: None if n in ("flax", "equinox") else real(n)
    )
    env = doctor.environment()
    assert env["flax"] == "not installed"  # always listed
    assert "equinox" not in env  # listed only when installed


def test_check_captured_constant_validates_size():
    with pytest.raises(ValueError, match="`n` must be >= 1"):
        doctor.check_captured_constant(n=0)
    with pytest.raises(TypeError, match="`n` must be an int"):
        doctor.check_captured_constant(n=2.5)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_environment_names_backend_device_precision_and_float64():
    import jax

    env = doctor.environment()
    assert env["backend"] == jax.default_backend()
    assert env["device_kind"] == jax.devices()[0].device_kind
    assert env["float64_native"] is (jax.default_backend() in ("cpu", "gpu"))
    assert str(env["matmul_precision"]).startswith("default: ")
    with jax.default_matmul_precision("highest"):
        assert doctor.matmul_precision() == "highest (jax_default_matmul_precision)"
    # what each backend computes at its default, whatever runs here
    assert doctor.matmul_precision("tpu") == "default: one bfloat16 pass (about 3 digits)"
    assert (doctor.float64_native("tpu"), doctor.float64_native("cpu")) == (False, True)


@pytest.mark.parametrize(
    ("version", "status"),
    [("0.10.2", "PASS"), ("0.12.1", "PASS"), ("0.12.2", "WARN"), ("0.13.0rc1", "WARN")],
)
def test_a_jax_newer_than_the_newest_tested_is_a_note(version, status):
    check = doctor.check_tested_jax(version)
    assert check.status == status
    assert version in check.detail and doctor.NEWEST_TESTED_JAX in check.detail

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
    # JAX 0.12.0.1 on CPU: both pitfalls are real here; a newer JAX may fix them.
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
    assert report["environment"]["jax"] == "0.12.0.1"
    assert {c["status"] for c in report["checks"]} <= {"PASS", "WARN"}
    assert len(report["checks"]) == 3
    env = report["environment"]
    for name in ("optax", "flax", "orbax-checkpoint", "dp-accounting", "equinox"):
        assert env[name] == importlib.metadata.version(name), name


def test_environment_lists_ecosystem_versions(monkeypatch):
    env = doctor.environment()
    assert env["optax"] == importlib.metadata.version("optax")
    assert env["orbax-checkpoint"] == importlib.metadata.version("orbax-checkpoint")
    assert env["dp-accounting"] == importlib.metadata.version("dp-accounting")
    assert env["jaxlib"] == "0.12.0.1"

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
        doctor.check_captured_constant(n=2.5)

"""Tests for the jaxwise command line and doctor."""

import json
import subprocess
import sys

import pytest

import jaxwise
from jaxwise import doctor
from jaxwise.cli import main


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"jaxwise {jaxwise.__version__}"


def test_missing_command_is_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "COMMAND" in capsys.readouterr().err


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
        [sys.executable, "-m", "jaxwise.cli", "doctor", "--json"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["environment"]["jax"] == "0.12.0.1"
    assert {c["status"] for c in report["checks"]} <= {"PASS", "WARN"}
    assert len(report["checks"]) == 3

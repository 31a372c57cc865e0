"""Tests for jaxwise.cli._doctor (`jaxwise doctor`): the live pitfall checks and the command."""

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys

import jax
import pytest

from jaxwise.cli import _doctor as doctor


def test_doctor_checks_reproduce_the_known_pitfalls():
    checks = {c.name: c for c in doctor.run_checks()}
    # JAX 0.10.2-0.12.1 on CPU: both pitfalls are real here (the donation one changed form in
    # 0.12.1: the array is deleted, the view keeps its buffer); a newer JAX may fix them.
    assert checks["debug_nans after vmap"].status == "WARN"
    view = checks["np.asarray and donation"]
    if jax.default_backend() == "cpu":
        assert view.status == "WARN"
    else:  # np.asarray copies off the CPU: the pitfall cannot bite
        assert (view.status, view.detail) == (
            "PASS",
            f"not applicable on {jax.default_backend()} (no zero-copy host views)",
        )
    assert checks["captured constant"].status == "PASS"
    assert "KiB" in checks["captured constant"].detail


def test_doctor_in_process_probe_restores_flag():
    check = doctor.check_debug_nans_after_vmap(isolated=False)
    assert check.status in ("PASS", "WARN")
    assert jax.config.jax_debug_nans is False


def _cpu_env_if_the_chip_is_held():
    """The environment for a child process: on a CPU as is; else ``JAX_PLATFORMS=cpu``.

    A TPU opens in one process only: while this process holds it, a child can open the CPU.
    """
    env = dict(os.environ)
    if jax.default_backend() != "cpu":
        env["JAX_PLATFORMS"] = "cpu"
    return env


def test_doctor_command_json():
    proc = subprocess.run(
        [sys.executable, "-m", "jaxwise.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=_cpu_env_if_the_chip_is_held(),
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["environment"]["backend"] == "cpu"
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


def test_environment_names_backend_device_precision_and_float64(backend_default_precision):
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


HELD = (
    "Unable to initialize backend 'tpu': ABORTED: Internal error when accessing libtpu "
    "multi-process lockfile. Run \"$ sudo rm /tmp/libtpu_lockfile\". (set JAX_PLATFORMS='' to "
    "automatically choose an available backend)"
)


@pytest.fixture
def held_tpu(monkeypatch):
    """JAX's devices fail to start as a TPU held by another process does (libtpu's message)."""

    def devices(*args, **kwargs):
        raise RuntimeError(HELD)

    monkeypatch.setattr(doctor, "_devices", devices)


def test_a_backend_that_cannot_start_is_named_with_why(held_tpu):
    env = doctor.environment()
    assert doctor.backend_error() == doctor.failure(env) == ("tpu", env["backend_error"])
    assert env["backend"] == "tpu" and env["jax"] == jax.__version__
    assert env["optax"] == importlib.metadata.version("optax")
    why = str(env["backend_error"])
    assert why.startswith("held by another process") and "never delete" in why
    assert "rm " not in why and "sudo" not in why and "libtpu multi-process lockfile" in why
    assert "device_kind" not in env and "matmul_precision" not in env


def test_doctor_reports_a_backend_that_cannot_start_and_exits_1(held_tpu, capsys):
    from jaxwise.cli import main

    assert main(["doctor", "--json"]) == 1
    out, err = capsys.readouterr()
    report = json.loads(out)
    checks = report["checks"]
    assert [(c["name"], c["status"]) for c in checks] == [
        ("backend", "FAIL"),
        ("tested_jax", "PASS"),
    ]
    assert "backend 'tpu' cannot start: held by another process" in checks[0]["detail"]
    for name in doctor.DEVICE_CHECKS:  # named as not run
        assert name in checks[0]["detail"]
    assert report["environment"]["jax"] == jax.__version__ and "sudo" not in out + err
    assert main(["doctor"]) == 1
    out, _ = capsys.readouterr()
    assert "backend_error" in out and "FAIL" in out and "tested_jax" in out and "sudo" not in out


def test_doctor_on_a_tpu_that_cannot_start_in_a_fresh_process():
    """``JAX_PLATFORMS=tpu``: no libtpu here (a CPU machine), or the chip held by this process."""
    if jax.default_backend() != "tpu" and importlib.util.find_spec("libtpu") is not None:
        pytest.skip("libtpu is installed and no process here holds a TPU: it may start")
    env = dict(os.environ, JAX_PLATFORMS="tpu")
    proc = subprocess.run(
        [sys.executable, "-m", "jaxwise.cli", "doctor", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["environment"]["backend"] == "tpu" and report["environment"]["backend_error"]
    assert report["environment"]["jax"] == importlib.metadata.version("jax")
    assert [c["status"] for c in report["checks"]] == ["FAIL", "PASS"]
    assert "sudo rm" not in proc.stdout


def test_the_debug_nans_probe_runs_on_the_cpu_while_this_process_holds_a_chip(monkeypatch):
    """A TPU opens in one process at a time: the probe's fresh interpreter takes the CPU."""
    seen = {}
    real_run = subprocess.run

    def run(*args, **kwargs):
        seen["env"] = kwargs.get("env") or {}
        return real_run(*args, **kwargs)

    monkeypatch.setattr(doctor.subprocess, "run", run)
    monkeypatch.setattr(doctor.jax, "default_backend", lambda: "tpu")  # the chip, injected
    check = doctor.check_debug_nans_after_vmap()
    assert seen["env"]["JAX_PLATFORMS"] == "cpu"
    assert check.status == "WARN"  # JAX 0.10.2-0.12.1, as on the CPU (the first test)

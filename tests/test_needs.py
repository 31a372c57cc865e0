"""Optional extras (tests/needs.py): a test that needs an absent extra is skipped by name.

The representative subset is the MLflow tests (the TPU image has no mlflow): with mlflow
hidden in a fresh pytest process, each of them is skipped with a reason naming mlflow and its
install, and nothing fails.
"""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import jax
import pytest
from needs import have, needs

ROOT = Path(__file__).resolve().parents[1]
HIDE = """
import sys
for name in [n for n in sys.modules if n == "mlflow" or n.startswith("mlflow.")]:
    sys.modules[name] = None
sys.modules["mlflow"] = None  # `import mlflow` raises ImportError; find_spec gives None
"""
# MLflow tests that check behaviour without mlflow (a missing extra, bad input before import)
NEED_NO_MLFLOW = ("test_missing_extra_names_it", "test_mlflow_refuses_a_file_as_its_store")
SUBSET = [
    "tests/test_metrics.py",
    "tests/test_cli_fit.py::test_every_writer_holds_every_epoch_once",
    "tests/test_cli_fit.py::test_resume_continues_every_writer_without_a_step_twice",
    "tests/test_cli_fit.py::test_the_readme_tensorboard_block_runs",
    "tests/test_cli_fit.py::test_spiral_logs_every_epoch_to_every_writer",
]


def test_needs_names_the_missing_module_and_its_install(monkeypatch):
    assert have("numpy") and not have("no_such_module_here")
    assert needs("numpy").args == (False,)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    assert not have("mlflow") and not have("mlflow.tracking")
    mark = needs("numpy", "mlflow")
    assert mark.args == (True,)
    assert mark.kwargs["reason"] == "needs mlflow: pip install 'jaxwise[mlflow]'"
    with pytest.raises(ValueError, match="`modules` must name at least one module"):
        needs()


def test_the_mlflow_tests_skip_by_name_without_mlflow(tmp_path):
    (tmp_path / "hide_mlflow.py").write_text(HIDE)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tmp_path), str(ROOT / "src"), *filter(None, [env.get("PYTHONPATH")])]
    )
    if jax.default_backend() != "cpu":  # the chip is held by this process
        env["JAX_PLATFORMS"] = "cpu"
    junit = tmp_path / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "hide_mlflow", "-p", "no:cacheprovider", "-q",
         "-m", "not slow", f"--basetemp={tmp_path / 'inner'}", f"--junitxml={junit}", *SUBSET],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = list(ET.parse(junit).getroot().iter("testcase"))
    skipped = {
        c.get("name", ""): (c.find("skipped").get("message") or "")  # pyright: ignore[reportOptionalMemberAccess]
        for c in cases
        if c.find("skipped") is not None
    }
    failed = [
        c.get("name") for c in cases if c.find("failure") is not None or c.find("error") is not None
    ]
    assert not failed
    cli = {test.split("::")[1] for test in SUBSET if "::" in test}
    mlflow_tests = [
        name
        for name in (c.get("name", "") for c in cases)
        if name in cli or ("mlflow" in name and not name.startswith(NEED_NO_MLFLOW))
    ]
    assert len(mlflow_tests) == 22  # the 22 that failed on the TPU image without mlflow (7c93a96)
    for name in mlflow_tests:
        assert "needs mlflow: pip install 'jaxwise[mlflow]'" in skipped.get(name, ""), name
    assert len(cases) > len(skipped)  # the rest ran (and passed) without mlflow

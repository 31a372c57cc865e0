"""CLI start-up: each command imports only what it needs (checked in a fresh interpreter)."""

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("jax", "numpy", "importlib.metadata", "jaxwise.lint", "jaxwise.cli._jobs", "rich")


def _imported_after(argv, tmp_path):
    """The HEAVY modules present in ``sys.modules`` after ``jaxwise.cli.main(argv)``."""
    code = (
        "import json, sys\nfrom jaxwise.cli import main\n"
        f"try:\n    main({argv!r})\nexcept SystemExit:\n    pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]), file=sys.stderr)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    return json.loads(proc.stderr.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("argv", "allowed"),
    [
        (["--help"], []),
        (["--version"], ["importlib.metadata"]),
        (["spiral", "--help"], []),
        (["lint", "ok.py"], ["jaxwise.lint"]),
        (["lint", "--select", "JW001", "ok.py"], ["jaxwise.lint"]),
        (["train", "missing.csv", "--label", "y", "--hidden", "100000,100000"], ["numpy"]),
    ],
)
def test_each_command_imports_only_what_it_needs(tmp_path, argv, allowed):
    (tmp_path / "ok.py").write_text("x = 1\n")
    assert _imported_after(argv, tmp_path) == allowed

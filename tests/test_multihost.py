"""Multi-process data parallelism: the docs/scale-out.md recipe, 2 processes x 2 CPU devices."""

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from host64 import mesh_devices

from jaxwise.checkpoint import restore
from jaxwise.sharding import data_mesh
from jaxwise.tree import host_copy

DOC = Path(__file__).resolve().parent.parent / "docs" / "scale-out.md"


def recipe_source() -> str:
    """The one ```python block of the docs that calls jax.distributed.initialize."""
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.M | re.S)
    found = [b for b in blocks if "jax.distributed.initialize" in b]
    assert len(found) == 1, "docs/scale-out.md must hold exactly one multi-host recipe"
    return found[0]


def load_recipe(path: Path):
    spec = importlib.util.spec_from_file_location("multihost_recipe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_two_processes_train_save_restore_like_one_process(tmp_path):
    script = tmp_path / "multihost.py"
    script.write_text(recipe_source(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 processes, 4 devices: step 8" in proc.stdout, proc.stdout
    multi = np.load(tmp_path / "params.npz")

    # The same recipe in this (single) process, on 4 of the fake CPU devices.
    recipe = load_recipe(script)
    mesh = data_mesh(mesh_devices(4))
    single, _ = recipe.train(tmp_path / "single-ckpt", mesh=mesh)
    np.testing.assert_allclose(multi["w"], np.asarray(single.params["w"]), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(multi["b"], np.asarray(single.params["b"]), rtol=1e-5, atol=1e-5)

    # The checkpoint both processes wrote (step 4) restores here, onto the 4-device mesh.
    like = restore(tmp_path / "single-ckpt", like=single)
    from_multi = restore(tmp_path / "checkpoints", like=single)
    assert int(from_multi.step) == int(like.step) == 4
    assert from_multi.params["w"].sharding == single.params["w"].sharding
    for a, b in zip(jax.tree.leaves(host_copy(from_multi)), jax.tree.leaves(host_copy(like))):
        np.testing.assert_allclose(
            np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=1e-5, atol=1e-6
        )

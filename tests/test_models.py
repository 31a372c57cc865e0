"""Tests for jaxwise.models: He initialisation, shapes, one compiled init, float64 forward pass."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise.compilation import CompileBudget
from jaxwise.models import init_mlp, mlp_apply


def test_mlp_he_init_and_shapes():
    params = init_mlp(jax.random.key(0), (100, 400, 3))
    w = np.asarray(params["dense_0"]["w"])
    assert w.shape == (100, 400) and abs(w.std() - np.sqrt(2 / 100)) < 0.01
    assert not np.asarray(params["dense_0"]["b"]).any()
    assert mlp_apply(params, jnp.ones((7, 100))).shape == (7, 3)
    assert mlp_apply(params, jnp.ones(100)).shape == (3,)
    with pytest.raises(ValueError, match="features"):
        mlp_apply(params, jnp.ones(5))
    with pytest.raises(ValueError, match="sizes"):
        init_mlp(0, (3,))


def test_init_compiles_once_and_forward_matches_float64():
    keys = [jax.random.key(i) for i in range(3)]
    with CompileBudget(1, "_init_mlp", exact=True):
        params = [init_mlp(k, (3, 8, 2)) for k in keys]
    x = np.random.default_rng(0).normal(size=(5, 3))
    p = {
        k: {n: np.asarray(v, np.float64) for n, v in layer.items()}
        for k, layer in params[0].items()
    }
    ref = (
        np.maximum(x @ p["dense_0"]["w"] + p["dense_0"]["b"], 0) @ p["dense_1"]["w"]
        + p["dense_1"]["b"]
    )
    np.testing.assert_allclose(
        np.asarray(mlp_apply(params[0], jnp.asarray(x, jnp.float32))), ref, rtol=1e-5, atol=1e-6
    )


@pytest.mark.slow
def test_core_imports_without_flax_or_equinox_and_adapters_say_what_to_install():
    import subprocess
    import sys

    code = (
        "import sys\n"
        "for name in ('flax', 'flax.nnx', 'flax.linen', 'flax.core', 'equinox'):\n"
        "    sys.modules[name] = None  # as if not installed: importing raises ImportError\n"
        "import jaxwise, jaxwise.models, jaxwise.optim, jaxwise.train\n"
        "for adapter, extra in (('from_nnx', 'flax'), ('from_equinox', 'equinox')):\n"
        "    try:\n"
        "        getattr(jaxwise.models, adapter)(object())\n"
        "    except ImportError as err:\n"
        "        assert f\"pip install 'jaxwise[{extra}]'\" in str(err), err\n"
        "    else:\n"
        "        raise AssertionError(adapter)\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr

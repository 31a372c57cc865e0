"""``jaxwise spiral``'s float64 guarantees on every backend: the precision they check at.

A TPU multiplies float32 matrices in one bfloat16 pass by default (~3 digits); the job's
float64 guarantees re-compute the logits at ``"highest"`` precision and derive their limits
from the precision they ran at, so that they check the mathematics, not the backend. The
low-precision path is injected here (``VERIFY_PRECISION = "bfloat16"``: bfloat16 operands,
also on CPU), and the summary names the backend and device kind.
"""

import json

import jax
import numpy as np
import pytest

from jaxwise.cli import main
from jaxwise.cli._jobs import _common as C
from jaxwise.cli._jobs import spiral
from jaxwise.cli._jobs.spiral import SpiralConfig, run_spiral
from jaxwise.models import init_mlp, mlp_apply


def small_run(**kw):
    return run_spiral(
        SpiralConfig(epochs=3, n_per_class=60, out=None, progress=False, cache=False, **kw)
    )


def test_matmul_precision_name_follows_the_backend():
    assert C.matmul_precision_name("highest") == "float32"
    assert C.matmul_precision_name("float32", "tpu") == "float32"
    assert C.matmul_precision_name(None, "tpu") == "bfloat16"  # a TPU's default: one pass
    assert C.matmul_precision_name("default", "cpu") == "float32"
    assert C.matmul_precision_name("high", "tpu") == "bfloat16_3x"
    assert C.matmul_precision_name("tensorfloat32") == "tensorfloat32"
    with pytest.raises(ValueError, match="`precision` must be a JAX matmul precision"):
        C.matmul_precision_name("half")


def _model_and_data(rng):
    params = jax.tree.map(np.asarray, init_mlp(0, (2, 64, 64, 3)))
    x = rng.normal(size=(300, 2)).astype(np.float32)
    y = rng.integers(0, 3, 300)
    return params, x, y


def _bf16_logits(params, x):
    return np.asarray(spiral._bfloat16_logits(params, jax.numpy.asarray(x)))


def test_the_a_priori_bound_holds_and_scales_with_the_precision(rng):
    params, x, _ = _model_and_data(rng)
    ref = C.mlp_float64(params, x)
    f32 = C.mlp_logit_error_bound(params, x, "float32")
    bf16 = C.mlp_logit_error_bound(params, x, "bfloat16")
    assert f32.shape == bf16.shape == ref.shape
    assert np.all(np.abs(np.asarray(mlp_apply(params, x), np.float64) - ref) <= f32)
    error16 = np.abs(_bf16_logits(params, x) - ref)
    assert np.all(error16 <= bf16)
    assert error16.max() > 10 * f32.max()  # the path really is low-precision
    # operand roundoff 2^-8 vs float32's 2^-24, diluted by float32's (k + 2) u32 accumulation
    assert 2.0**10 < bf16.max() / f32.max() < 2.0**17


def test_float64_check_passes_bfloat16_logits_at_bfloat16_and_fails_them_at_float32(rng):
    params, x, y = _model_and_data(rng)
    logits = _bf16_logits(params, x)
    ce = float(C.mlp_float64(params, x).std())  # any value: only the CE fields change
    low = C.float64_check(params, x, y, logits, ce, "bfloat16")
    assert low["precision"] == "bfloat16" and low["logits_ok"] and low["accuracy_ok"]
    assert low["max_logit_error"] > 1e-4 and low["logit_limit"] > low["max_logit_error"]
    assert not C.float64_check(params, x, y, logits, ce, "float32")["logits_ok"]
    # a wrong logit fails at any precision: the limit is the mathematics, not a free pass
    wrong = logits.copy()
    wrong[7, 1] += 2 * low["logit_limit"]
    assert not C.float64_check(params, x, y, wrong, ce, "bfloat16")["logits_ok"]


def test_spiral_guarantees_with_a_bfloat16_compute_path_state_it_and_pass(monkeypatch):
    monkeypatch.setattr(spiral, "VERIFY_PRECISION", "bfloat16")
    summary = small_run()
    checks = summary["checks"]
    for name in ("float64_logits", "float64_cross_entropy", "float64_accuracy"):
        assert checks[name]["ok"], checks[name]
        assert "bfloat16 matmuls" in checks[name]["detail"], checks[name]
    assert "a-priori bound" in checks["float64_logits"]["detail"]
    assert summary["float64"]["precision"] == "bfloat16"
    assert summary["float64"]["max_logit_error"] > 1e-4  # bfloat16 operands: ~3 digits


def test_spiral_guarantees_check_at_highest_precision_by_default(backend_default_precision):
    # training at the backend's default (a TPU: one bfloat16 pass), the check at "highest"
    assert spiral.VERIFY_PRECISION == "highest" and jax.config.jax_default_matmul_precision is None
    summary = small_run()
    for name in ("float64_logits", "float64_cross_entropy", "float64_accuracy"):
        assert summary["checks"][name]["ok"], summary["checks"][name]
        assert "float32 matmuls" in summary["checks"][name]["detail"]
    assert summary["float64"]["max_logit_error"] < 1e-4
    assert summary["float64"]["logit_limit"] == 1e-4


def test_spiral_json_and_table_name_the_backend_and_device_kind(capsys):
    device = jax.devices()[0]
    args = ["spiral", "--epochs", "2", "--no-plots", "--no-progress", "--no-cache"]
    main([*args, "--json"])  # exit 1: 2 epochs miss the accuracy guarantee
    summary = json.loads(capsys.readouterr().out)
    assert summary["backend"] == device.platform == jax.default_backend()
    assert summary["device_kind"] == device.device_kind
    main(args)
    out = capsys.readouterr().out
    assert "device" in out and f"{device.platform} ({device.device_kind})" in out

"""The float32 tolerance helper (tests/tolerance.py): its figures come from the accuracy table.

The device is injected (``tolerance._device``), so the TPU tolerances are checked on a CPU.
"""

import jax
import numpy as np
import pytest
import tolerance
from host64 import host_default
from tolerance import EPS32, ULPS, allclose, bound, row, rtol, ulps

V5E = ("tpu", "TPU v5 lite")


@pytest.fixture
def on_a_v5e(monkeypatch):
    """The current device reads as a TPU v5e (the computation itself stays on the CPU)."""
    monkeypatch.setattr(tolerance, "_device", lambda: V5E)


def test_the_table_is_jax_s_float32_bounds():
    # JAX's accuracy bounds, float32, TPU v2-v5e and CPU
    assert ULPS["tpu_v2-v5e"] == {
        "log": 4030.5,
        "log1p": 4034.0,
        "tanh": 1365.5,
        "logistic": 243.0,
        "reciprocal": 198.0,
        "exp": 116.0,
    }
    assert max(ULPS["cpu"].values()) <= 5.0 and min(ULPS["cpu"].values()) >= 0.5
    assert all(set(r) == set(ULPS["cpu"]) for r in ULPS.values())
    assert EPS32 == 2.0**-23


@pytest.mark.parametrize(
    ("platform", "kind", "expected"),
    [
        ("cpu", "cpu", "cpu"),
        ("gpu", "NVIDIA H100 80GB HBM3", "gpu"),
        ("tpu", "TPU v2", "tpu_v2-v5e"),
        ("tpu", "TPU v3", "tpu_v2-v5e"),
        ("tpu", "TPU v4", "tpu_v2-v5e"),
        ("tpu", "TPU v4 lite", "tpu_v2-v5e"),
        ("tpu", "TPU v5 lite", "tpu_v2-v5e"),
        ("tpu", "TPU v5e", "tpu_v2-v5e"),
        ("tpu", "TPU v5", "tpu_v5p"),
        ("tpu", "TPU v5p", "tpu_v5p"),
        ("tpu", "TPU v6 lite", "tpu_v6e"),
        ("tpu", "TPU7x", "tpu_7x"),
        ("tpu", "TPU v9 someday", "tpu_v2-v5e"),  # unnamed: the widest bounds
    ],
)
def test_device_kinds_map_to_their_row(platform, kind, expected):
    assert row(platform, kind) == expected


def test_tpu_tolerances_come_out_of_the_table(on_a_v5e):
    assert ulps("log") == 4030.5 and ulps("tanh") == 1365.5
    assert rtol("log", floor=1e-5) == pytest.approx(4030.5 * 2.0**-23)  # ≈ 4.8e-4
    assert rtol("tanh", floor=1e-5) == pytest.approx(1365.5 * 2.0**-23)  # ≈ 1.6e-4
    assert rtol("exp", "reciprocal", floor=1e-6) == pytest.approx((116 + 198) * 2.0**-23)
    assert rtol("tanh", floor=1e-5, scale=4.0) == pytest.approx(4 * 1365.5 * 2.0**-23)
    assert rtol("exp", floor=1e-3) == 1e-3  # the floor is never lowered
    tol = allclose("tanh", rtol=1e-5, atol=1e-6, magnitude=6.6, scale=4.0)
    assert tol == pytest.approx({"rtol": 4 * 1365.5 * EPS32, "atol": 4 * 1365.5 * EPS32 * 6.6})


def test_the_observed_tpu_errors_lie_within_the_table_s_tolerances():
    """The v5e's measured errors (triage of 7c93a96) pass; they failed the CPU-sized ones."""
    observed = [  # (float32 on the TPU, float64), ops
        ((2.942300796508789, 2.9424877590351786), ("log",)),  # entropy
        ((1.0986746549606323, 1.0986122886681098), ("log",)),  # log(3)
        ((2.696912, 2.696891), ("log", "exp")),  # logsumexp
        ((0.26894107460975647, 0.2689414213699951), ("exp", "reciprocal")),  # softmax
    ]
    for (got, want), ops in observed:
        assert abs(got - want) > 1e-6 * abs(want)
        assert abs(got - want) <= rtol(*ops, floor=1e-6, device=V5E) * abs(want)


def test_a_cpu_keeps_the_test_s_own_tolerance(monkeypatch):
    monkeypatch.setattr(tolerance, "_device", lambda: ("cpu", "cpu"))
    assert rtol("log", floor=1e-5) == 1e-5
    assert rtol("tanh", floor=1e-5, scale=4.0) == 1e-5
    assert allclose("tanh", rtol=1e-5, atol=1e-6, magnitude=6.6, scale=4.0) == {
        "rtol": 1e-5,
        "atol": 1e-6,
    }


def test_the_current_device_follows_the_default_device():
    assert tolerance.current_device() == (jax.default_backend(), jax.devices()[0].device_kind)
    with host_default():
        assert tolerance.current_device()[0] == "cpu"
    with jax.default_device(jax.devices("cpu")[0]):
        assert tolerance.current_device() == ("cpu", jax.devices("cpu")[0].device_kind)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="`op` must be one of"):
        ulps("sqrt")
    with pytest.raises(ValueError, match="`ops` must name at least one"):
        bound()
    assert np.isfinite(bound("log", device=("gpu", "any")))

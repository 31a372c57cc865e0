"""jaxwise._shared._checks: the shared validators accept NumPy scalars, reject bools, name the
argument."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise._shared import _checks as C


@pytest.mark.parametrize("value", [3, np.int32(3), np.int64(3), np.array(3), np.uint8(3)])
def test_check_int_accepts_python_and_numpy_integers(value):
    assert C.check_int(value, "n", min_value=1, max_value=3) == 3
    assert type(C.check_int(value, "n")) is int


@pytest.mark.parametrize(
    ("value", "error", "words"),
    [
        (True, TypeError, "`n` must be an int"),
        (3.0, TypeError, "`n` must be an int"),
        ("3", TypeError, "`n` must be an int"),
        (None, TypeError, "`n` must be an int"),
        (0, ValueError, "`n` must be >= 1"),
        (9, ValueError, "`n` must be <= 5"),
    ],
)
def test_check_int_errors_name_the_argument(value, error, words):
    with pytest.raises(error, match=words):
        C.check_int(value, "n", min_value=1, max_value=5)


@pytest.mark.parametrize(
    "value", [0.5, np.float32(0.5), np.float64(0.5), np.array(0.5), 1, jnp.float32(0.5)]
)
def test_check_float_accepts_real_scalars(value):
    assert C.check_float(value, "lr", min_value=0.0, max_value=1.0) == pytest.approx(float(value))


@pytest.mark.parametrize(
    ("value", "kwargs", "error", "words"),
    [
        (math.nan, {}, ValueError, "finite"),
        (math.inf, {}, ValueError, "finite"),
        (np.bool_(True), {}, TypeError, "bool"),
        ("0.1", {}, TypeError, "real number"),
        (np.ones(2), {}, TypeError, "real number"),
        (0.0, {"min_value": 0.0, "min_inclusive": False}, ValueError, "> 0.0"),
        (1.0, {"max_value": 1.0, "max_inclusive": False}, ValueError, "< 1.0"),
    ],
)
def test_check_float_errors(value, kwargs, error, words):
    with pytest.raises(error, match=words):
        C.check_float(value, "lr", **kwargs)


def test_check_float_under_jit_accepts_traced_scalars_only_when_allowed():
    @jax.jit
    def f(x):
        assert math.isnan(C.check_float(x, "lr", allow_traced=True))
        with pytest.raises(TypeError, match="`lr`"):
            C.check_float(x, "lr")
        return x

    f(jnp.float32(0.1))


def test_probability_choice_callable():
    assert C.check_probability(1.0, "q") == 1.0
    with pytest.raises(ValueError, match="`q` must be < 1.0"):
        C.check_probability(1.0, "q", open_high=True)
    assert C.check_choice("rdp", "accountant", ("rdp", "pld")) == "rdp"
    with pytest.raises(ValueError, match="`accountant` must be one of 'rdp', 'pld'"):
        C.check_choice("RDP", "accountant", ("rdp", "pld"))
    with pytest.raises(TypeError, match="`f` must be callable"):
        C.check_callable(3, "f")


def test_check_array_rank_dtype_and_emptiness():
    assert C.check_array([[1.0, 2.0]], "x", ndim=2, dtype_kind="f").shape == (1, 2)
    assert C.check_array(jnp.ones(3, jnp.bfloat16), "x", dtype_kind="f").shape == (3,)
    for bad, error, words in [
        ("abc", TypeError, "`x` must be an array"),
        (None, TypeError, "`x` must be an array"),
        (["a", "b"], TypeError, "numeric"),
        (np.ones((2, 2)), ValueError, "1 dimension"),
        (np.ones(3, np.int32), TypeError, "floating"),
        (np.ones(0), ValueError, "must not be empty"),
    ]:
        with pytest.raises(error, match=words):
            C.check_array(bad, "x", ndim=1, dtype_kind="f", non_empty=True)


def test_check_key_accepts_typed_and_raw_keys_only():
    C.check_key(jax.random.key(0))
    C.check_key(jax.random.PRNGKey(0))  # noqa: JW004 - the legacy form is still accepted
    for bad in (0, np.zeros(2, np.uint32), jnp.zeros(3, jnp.uint32), "key"):
        with pytest.raises(TypeError, match="`key` must be a JAX PRNG key"):
            C.check_key(bad)


def test_is_key_is_true_for_typed_keys_only():
    key = jax.random.key(0)
    assert C.is_key(key) and C.is_key(jax.random.split(key, 3))
    assert C.is_key(jax.ShapeDtypeStruct((), key.dtype))  # abstract values too
    assert jax.jit(lambda k: jnp.asarray(C.is_key(k)))(key)  # and tracers
    legacy = jax.random.PRNGKey(0)  # noqa: JW004 - raw key data is not a typed key
    for not_a_key in (legacy, np.zeros(2, np.uint32), 3, "key", None):
        assert not C.is_key(not_a_key)


def test_user_error_is_an_exception_not_a_value_error():
    assert issubclass(C.UserError, Exception) and not issubclass(C.UserError, ValueError)


def test_check_bool_and_check_path(tmp_path):
    assert C.check_bool(np.True_, "donate") is True
    for bad in (1, "yes", None):
        with pytest.raises(TypeError, match="`donate` must be a bool"):
            C.check_bool(bad, "donate")
    assert C.check_path(tmp_path, "out") == tmp_path
    with pytest.raises(TypeError, match="`out` must be a path"):
        C.check_path(b"runs", "out")
    with pytest.raises(ValueError, match="`out` must not be empty"):
        C.check_path("", "out")

"""Tests for jaxwise.tree: names by key path, tables, masks, comparisons, host copies."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise.tree import host_copy, mask_by_path, param_table, path_names, tree_allclose


class Moments(NamedTuple):
    mu: object
    nu: object


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Box:
    inner: object


def test_path_names_follow_flatten_order_not_insertion_order():
    params = {"z_last": {"w": jnp.ones(2)}, "a_first": {"w": jnp.ones(3), "b": jnp.ones(1)}}
    names = path_names(params)
    assert names == ["a_first.b", "a_first.w", "z_last.w"]
    assert [leaf.shape for leaf in jax.tree.leaves(params)] == [(1,), (3,), (2,)]
    zipped_wrongly = [f"{k}" for k in params]  # what zipping dict keys with leaves would give
    assert zipped_wrongly[0] == "z_last"


def test_path_names_for_namedtuples_lists_and_dataclasses():
    tree = {
        "opt": (Moments(mu=[jnp.ones(1), jnp.ones(2)], nu=None),),
        "box": Box(inner=jnp.ones(3)),
    }
    assert path_names(tree) == ["box.inner", "opt.0.mu.0", "opt.0.mu.1"]
    assert path_names(jnp.ones(2)) == [""]


def test_param_table_totals_and_rendering():
    params = {
        "dense_0": {"w": jnp.ones((2, 64)), "b": jnp.zeros(64)},
        "dense_1": {"w": jnp.ones((64, 3), jnp.bfloat16)},
    }
    table = param_table(params)
    true_count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
    assert table.total_count == true_count == 2 * 64 + 64 + 64 * 3
    assert table.total_bytes == (2 * 64 + 64) * 4 + 64 * 3 * 2
    assert [r.path for r in table.rows] == ["dense_0.b", "dense_0.w", "dense_1.w"]
    assert table.rows[2].dtype == "bfloat16" and table.rows[2].bytes == 384
    text = str(table)
    assert (
        "dense_0.w" in text and "(2, 64)" in text and "total" in text and f"{true_count:,}" in text
    )


def test_mask_by_path_regex_and_predicate():
    params = {"dense_0": {"w": jnp.ones(2), "b": jnp.ones(2)}, "norm": {"scale": jnp.ones(2)}}
    assert mask_by_path(params, r"\.w$") == {
        "dense_0": {"b": False, "w": True},
        "norm": {"scale": False},
    }
    assert mask_by_path(params, lambda p: p.startswith("norm")) == {
        "dense_0": {"b": False, "w": False},
        "norm": {"scale": True},
    }
    with pytest.raises(TypeError, match="predicate_or_regex"):
        mask_by_path(params, 3)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_tree_allclose():
    a = {"w": jnp.ones(3), "b": jnp.zeros(2)}
    assert tree_allclose(a, {"w": jnp.ones(3) + 1e-7, "b": jnp.zeros(2)})
    assert not tree_allclose(a, {"w": jnp.ones(3) + 1e-2, "b": jnp.zeros(2)})
    assert not tree_allclose(a, {"w": jnp.ones(3)})
    assert not tree_allclose(a, {"w": jnp.ones(4), "b": jnp.zeros(2)})
    assert tree_allclose(
        {"x": jnp.asarray([jnp.nan])}, {"x": jnp.asarray([jnp.nan])}, equal_nan=True
    )


def test_host_copy_is_a_real_copy():
    x = jnp.arange(4.0)
    view = np.asarray(x)
    copy = host_copy({"x": x, "k": jax.random.key(3), "n": 7})
    assert not np.shares_memory(copy["x"], view)
    assert copy["x"].flags.writeable and copy["n"] == 7
    assert copy["k"].dtype == np.uint32 and copy["k"].shape == (2,)
    assert param_table({"key": jax.random.key(0)}).rows[0].bytes == 8


def test_bad_arguments_name_the_argument():
    params = {"w": jnp.ones(2)}
    with pytest.raises(ValueError, match="`predicate_or_regex` is not a valid regular expression"):
        mask_by_path(params, r"dense_(")
    with pytest.raises(ValueError, match="`rtol` must be >= 0.0"):
        tree_allclose(params, params, rtol=-1.0)
    with pytest.raises(ValueError, match="`atol` must be finite"):
        tree_allclose(params, params, atol=float("nan"))
    assert tree_allclose(params, params, rtol=np.float32(1e-3))

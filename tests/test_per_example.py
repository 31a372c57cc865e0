"""Tests for jaxwise.per_example: per-example gradients, norms, clipping, chunks, batch forms."""

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from tolerance import allclose, rtol

from jaxwise import numerics
from jaxwise.compilation import CompileBudget
from jaxwise.models import init_mlp, mlp_apply, mlp_loss
from jaxwise.per_example import (
    auto_chunk_size,
    clip_and_sum,
    ghost_coverage,
    per_example_grad_norms,
    per_example_grads,
)


def xent_single(logits, y):
    return -numerics.log_softmax(logits)[y]


MLP_LOSS = mlp_loss(xent_single)


def mlp_single(params, example):
    x, y = example
    return xent_single(mlp_apply(params, x), y)


@pytest.fixture
def problem():
    params = init_mlp(jax.random.key(0), (5, 16, 16, 3))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(23, 5)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, 23), jnp.int32)
    return params, x, y


def _flat(tree):
    return np.concatenate(
        [np.asarray(leaf, np.float64).reshape(leaf.shape[0], -1) for leaf in jax.tree.leaves(tree)],
        axis=1,
    )


def test_vmap_grads_equal_python_loop_and_mean_equals_batch_gradient(problem):
    params, x, y = problem
    grads = per_example_grads(mlp_single, params, (x, y))
    for i in (0, 7, 22):
        single = jax.grad(mlp_single)(params, (x[i], y[i]))
        for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(single)):
            np.testing.assert_allclose(np.asarray(a[i]), np.asarray(b), rtol=1e-5, atol=1e-7)
    batch_grad = jax.grad(lambda p: jnp.mean(jax.vmap(mlp_single, in_axes=(None, 0))(p, (x, y))))(
        params
    )
    for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(batch_grad)):
        np.testing.assert_allclose(np.asarray(a).mean(0), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_default_in_axes_mistake_is_silent_and_ours_cannot_make_it():
    # params whose leading dimension equals the batch size: default in_axes=0 maps them too.
    w = jnp.asarray(np.random.default_rng(1).normal(size=(4, 4)), jnp.float32)
    x = jnp.asarray(np.random.default_rng(2).normal(size=(4, 4)), jnp.float32)

    def loss(w, x):
        return jnp.sum(jnp.tanh(x @ w))

    wrong = jax.vmap(jax.grad(loss))(w, x)  # no error, same shape as the right answer
    right = per_example_grads(loss, w, x)
    loop = jnp.stack([jax.grad(loss)(w, x[i]) for i in range(4)])
    assert wrong.shape == right.shape == (4, 4, 4) or wrong.shape != right.shape
    np.testing.assert_allclose(np.asarray(right), np.asarray(loop), rtol=1e-6)
    assert not np.allclose(np.asarray(wrong).reshape(-1)[:16], np.asarray(loop).reshape(-1)[:16])


@pytest.mark.parametrize("chunk", [1, 4, 5, 23, 64])
def test_chunked_norms_and_clipped_sums_equal_whole_batch(problem, chunk):
    params, x, y = problem
    whole_norms = per_example_grad_norms(mlp_single, params, (x, y), method="vmap")
    np.testing.assert_allclose(
        per_example_grad_norms(mlp_single, params, (x, y), chunk_size=chunk, method="chunked"),
        whole_norms,
        rtol=1e-5,
    )
    whole_sum, n1 = clip_and_sum(mlp_single, params, (x, y), clip_norm=0.5, method="vmap")
    chunk_sum, n2 = clip_and_sum(
        mlp_single, params, (x, y), clip_norm=0.5, chunk_size=chunk, method="chunked"
    )
    np.testing.assert_allclose(n2, n1, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(chunk_sum), jax.tree.leaves(whole_sum)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_norms_match_float64_reference(problem):
    params, x, y = problem
    grads = _flat(per_example_grads(mlp_single, params, (x, y)))
    clip = 0.3
    factor = np.minimum(1.0, clip / np.linalg.norm(grads, axis=1))
    for method in ("vmap", "ghost"):
        np.testing.assert_allclose(
            per_example_grad_norms(mlp_single, params, (x, y), method=method),
            np.linalg.norm(grads, axis=1),
            rtol=1e-5,
        )
        summed, norms = clip_and_sum(mlp_single, params, (x, y), clip_norm=clip, method=method)
        np.testing.assert_allclose(
            _flat(jax.tree.map(lambda a: a[None], summed))[0],
            (grads * factor[:, None]).sum(0),
            rtol=1e-4,
            atol=1e-6,
        )


@pytest.mark.parametrize("sizes", [(5, 3), (5, 16, 3), (5, 16, 16, 3), (5, 8, 32, 8, 3)])
def test_ghost_norms_equal_vmap_norms(sizes):
    params = init_mlp(jax.random.key(3), sizes)
    rng = np.random.default_rng(3)
    x = jnp.asarray(rng.normal(size=(17, 5)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 3, 17), jnp.int32)
    vmap_norms = per_example_grad_norms(MLP_LOSS, params, (x, y))
    ghost_norms = per_example_grad_norms(MLP_LOSS, params, (x, y), method="ghost")
    np.testing.assert_allclose(ghost_norms, vmap_norms, rtol=1e-4)
    g_sum, g_norms = clip_and_sum(MLP_LOSS, params, (x, y), clip_norm=0.4, method="ghost")
    v_sum, _ = clip_and_sum(MLP_LOSS, params, (x, y), clip_norm=0.4)
    for a, b in zip(jax.tree.leaves(g_sum), jax.tree.leaves(v_sum)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_ghost_works_for_any_loss_and_auto_is_the_default(problem):
    params, x, y = problem
    ref = per_example_grad_norms(mlp_single, params, (x, y), method="vmap")
    np.testing.assert_allclose(
        per_example_grad_norms(mlp_single, params, (x, y), method="ghost"), ref, rtol=1e-4
    )
    np.testing.assert_allclose(per_example_grad_norms(mlp_single, params, (x, y)), ref, rtol=1e-4)
    np.testing.assert_allclose(
        per_example_grad_norms(mlp_single, params, (x, y), method="chunked", chunk_size=5),
        ref,
        rtol=1e-5,
    )


def test_chunked_temp_memory_is_bounded_by_chunk_not_batch():
    params = init_mlp(jax.random.key(0), (64, 256, 256, 10))
    n_params = sum(leaf.size for leaf in jax.tree.leaves(params))
    x = jax.ShapeDtypeStruct((512, 64), jnp.float32)
    y = jax.ShapeDtypeStruct((512,), jnp.int32)
    spec = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), params)

    def temp(chunk):
        fn = jax.jit(
            lambda p, x, y: per_example_grad_norms(
                MLP_LOSS, p, (x, y), chunk_size=chunk, method="vmap"
            )
        )
        return fn.lower(spec, x, y).compile().memory_analysis().temp_size_in_bytes  # pyright: ignore[reportOptionalMemberAccess]  # memory_analysis() is available on CPU

    def temp_of(norms):
        return jax.jit(norms).lower(spec, x, y).compile().memory_analysis().temp_size_in_bytes  # pyright: ignore[reportOptionalMemberAccess]  # memory_analysis() is available on CPU

    full, chunk16 = temp(None), temp(16)
    ghost = temp_of(lambda p, x, y: per_example_grad_norms(MLP_LOSS, p, (x, y), method="ghost"))
    auto = temp_of(lambda p, x, y: per_example_grad_norms(MLP_LOSS, p, (x, y)))  # auto = ghost
    # upper bounds, on every backend: ≈ chunk × P floats (+ activations); ghost no more
    chunk_bound = 2 * 16 * n_params * 4 + 4 * 2**20
    assert max(chunk16, ghost, auto) <= chunk_bound
    if jax.default_backend() == "cpu":
        # XLA:CPU materialises the full batch's B × P gradients (XLA fuses some of it); XLA:TPU
        # compiles the full batch into less than a chunk's bound, so there is no lower bound there
        assert full >= 0.5 * 512 * n_params * 4
        assert chunk16 * 8 < full and ghost * 20 < full and auto * 20 < full


def test_auto_chunk_size_fits_budget(problem):
    params = init_mlp(jax.random.key(0), (64, 256, 10))
    x = jnp.ones((64, 64))
    y = jnp.zeros(64, jnp.int32)
    n_params = sum(leaf.size for leaf in jax.tree.leaves(params))

    def temp(chunk):
        fn = jax.jit(
            lambda p, b: per_example_grad_norms(MLP_LOSS, p, b, method="vmap", chunk_size=chunk)
        )
        return fn.lower(params, (x, y)).compile().memory_analysis().temp_size_in_bytes  # pyright: ignore[reportOptionalMemberAccess]  # memory_analysis() is available on CPU

    # ≈ 8 examples' gradients on XLA:CPU; at most half of what this backend's full batch needs
    # (XLA:TPU compiles the full batch into ~0.5 MB, under the CPU-sized budget)
    budget = min(8 * n_params * 4 + 2**20, temp(None) // 2)
    chunk = auto_chunk_size(MLP_LOSS, params, (x, y), memory_budget=budget)
    assert 1 <= chunk < 64
    assert chunk == 1 or temp(chunk) <= budget
    norms = per_example_grad_norms(
        MLP_LOSS, params, (x, y), chunk_size="auto", memory_budget=budget, method="chunked"
    )
    np.testing.assert_allclose(
        norms, per_example_grad_norms(MLP_LOSS, params, (x, y), method="vmap"), rtol=1e-5
    )
    assert auto_chunk_size(MLP_LOSS, params, (x, y), memory_budget=2**40) == 64


def test_jitted_norms_compile_once(problem):
    params, x, y = problem
    fn = jax.jit(
        lambda p, x, y: per_example_grad_norms(
            mlp_single, p, (x, y), chunk_size=8, method="chunked"
        )
    )
    batches = [(x + i, y) for i in range(3)]
    with CompileBudget(1, fn, exact=True):
        for bx, by in batches:
            fn(params, bx, by)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (
            lambda p, x, y: clip_and_sum(mlp_single, p, (x, y), clip_norm=0.0),
            ValueError,
            "clip_norm",
        ),
        (
            lambda p, x, y: clip_and_sum(mlp_single, p, (x, y), clip_norm=-1.0),
            ValueError,
            "clip_norm",
        ),
        (
            lambda p, x, y: per_example_grad_norms(mlp_single, p, (x, y), chunk_size=0),
            ValueError,
            "chunk_size",
        ),
        (
            lambda p, x, y: per_example_grad_norms(mlp_single, p, (x, y), chunk_size=2.5),  # pyright: ignore[reportArgumentType]  # bad input on purpose
            TypeError,
            "chunk_size",
        ),
        (
            lambda p, x, y: per_example_grad_norms(mlp_single, p, (x, y), memory_budget=0),
            ValueError,
            "memory_budget",
        ),
        (lambda p, x, y: per_example_grad_norms(mlp_single, p, (x, y[:5])), ValueError, "leading"),
        (lambda p, x, y: per_example_grads("loss", p, (x, y)), TypeError, "`loss`"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (
            lambda p, x, y: per_example_grad_norms(mlp_single, p, (x, y), method="fast"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
            ValueError,
            "method",
        ),
        (
            lambda p, x, y: clip_and_sum(mlp_single, p, (x, y), clip_norm=1.0, weights=jnp.ones(3)),
            ValueError,
            "weights",
        ),
    ],
)
def test_bad_input(problem, call, error, match):
    with pytest.raises(error, match=match):
        call(*problem)


# --------------------------------------------------------------------------
# One loss convention: the batch is ONE pytree argument (tuple, dict, dataclass)
# --------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Example:
    x: jax.Array
    y: jax.Array
    s: jax.Array


def _tanh_net(params, x, y, s):
    a = jnp.tanh(x @ params["w"] + params["b"])
    return s * (a @ params["v"] - y) ** 2


def tuple_loss(params, example):
    x, y, s = example
    return _tanh_net(params, x, y, s)


def dict_loss(params, example):
    return _tanh_net(params, example["x"], example["y"], example["s"])


def dataclass_loss(params, example):
    return _tanh_net(params, example.x, example.y, example.s)


@pytest.fixture
def forms():
    rng = np.random.default_rng(5)
    params = {
        "w": jnp.asarray(rng.normal(size=(4, 6)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=6) * 0.1, jnp.float32),
        "v": jnp.asarray(rng.normal(size=6), jnp.float32),
    }
    x = rng.normal(size=(9, 4)).astype(np.float32)
    y = rng.normal(size=9).astype(np.float32)
    s = rng.uniform(0.5, 2.0, size=9).astype(np.float32)
    batches = {
        "tuple": (tuple_loss, (jnp.asarray(x), jnp.asarray(y), jnp.asarray(s))),
        "dict": (dict_loss, {"x": jnp.asarray(x), "y": jnp.asarray(y), "s": jnp.asarray(s)}),
        "dataclass": (dataclass_loss, Example(jnp.asarray(x), jnp.asarray(y), jnp.asarray(s))),
    }
    return params, batches, _float64_grads(params, x, y, s)


def _float64_grads(params, x, y, s):
    """Per-example gradients of ``s (tanh(x w + b) · v − y)²`` by hand, NumPy float64."""
    w, b, v = (np.asarray(params[k], np.float64) for k in ("w", "b", "v"))
    x, y, s = (np.asarray(a, np.float64) for a in (x, y, s))
    a = np.tanh(x @ w + b)
    r = 2 * s * (a @ v - y)  # d loss / d output
    dz = r[:, None] * v[None, :] * (1 - a**2)
    return {"b": dz, "v": r[:, None] * a, "w": x[:, :, None] * dz[:, None, :]}


def _flat_ref(grads):
    return np.concatenate([grads[k].reshape(len(grads[k]), -1) for k in ("b", "v", "w")], 1)


@pytest.mark.parametrize("form", ["tuple", "dict", "dataclass"])
def test_per_example_grads_take_any_pytree_batch(forms, form):
    params, batches, ref = forms
    loss, batch = batches[form]
    grads = per_example_grads(loss, params, batch)
    for k in ("w", "b", "v"):
        # float32 tanh in the forward pass (the device's table; its error grows ~4× through the
        # backward pass), against float64: the test's own 1e-5/1e-6 on a CPU
        tol = allclose("tanh", rtol=1e-5, atol=1e-6, magnitude=np.abs(ref[k]).max(), scale=4.0)
        np.testing.assert_allclose(np.asarray(grads[k], np.float64), ref[k], **tol)


@pytest.mark.parametrize("method", ["auto", "ghost", "vmap", "chunked"])
@pytest.mark.parametrize("form", ["tuple", "dict", "dataclass"])
def test_norms_and_clipped_sums_take_any_pytree_batch(forms, form, method):
    params, batches, ref = forms
    loss, batch = batches[form]
    flat = _flat_ref(ref)
    norms64 = np.linalg.norm(flat, axis=1)
    chunk = 4 if method == "chunked" else None
    norms = per_example_grad_norms(loss, params, batch, method=method, chunk_size=chunk)
    # every method shares the float32 forward pass (tanh: the device's table) against float64;
    # the methods agree with each other far closer (test_norm_methods_agree_on_one_device)
    norm_rtol = rtol("tanh", floor=1e-5, scale=4.0)
    np.testing.assert_allclose(np.asarray(norms, np.float64), norms64, rtol=norm_rtol)
    weights = jnp.asarray(np.arange(9) % 3 != 1, jnp.float32)
    summed, norms = clip_and_sum(
        loss, params, batch, clip_norm=0.8, method=method, chunk_size=chunk, weights=weights
    )
    factor = np.minimum(1.0, 0.8 / norms64) * np.asarray(weights, np.float64)
    expected = (flat * factor[:, None]).sum(0)
    got = np.concatenate([np.asarray(summed[k], np.float64).ravel() for k in ("b", "v", "w")])
    tol = allclose("tanh", rtol=1e-4, atol=1e-6, magnitude=np.abs(expected).max(), scale=4.0)
    np.testing.assert_allclose(got, expected, **tol)
    np.testing.assert_allclose(np.asarray(norms, np.float64), norms64, rtol=norm_rtol)


@pytest.mark.parametrize("form", ["tuple", "dict", "dataclass"])
def test_norm_methods_agree_on_one_device(forms, form):
    """Ghost, vmap and chunked norms and clipped sums agree on the device in use, tightly.

    The DP promise rests on this agreement (one float32 forward pass, norms at HIGHEST), not on
    the device's transcendentals, which all methods share.
    """
    params, batches, _ = forms
    loss, batch = batches[form]
    weights = jnp.asarray(np.arange(9) % 3 != 1, jnp.float32)
    by_method = {}
    methods: tuple[tuple[Literal["ghost", "vmap", "chunked", "auto"], int | None], ...] = (
        ("ghost", None),
        ("vmap", None),
        ("chunked", 4),
        ("auto", None),
    )
    for method, chunk in methods:
        norms = per_example_grad_norms(loss, params, batch, method=method, chunk_size=chunk)
        summed, _ = clip_and_sum(
            loss, params, batch, clip_norm=0.8, method=method, chunk_size=chunk, weights=weights
        )
        by_method[method] = (np.asarray(norms), summed)
    vmap_norms, vmap_sum = by_method.pop("vmap")
    for method, (norms, summed) in by_method.items():
        np.testing.assert_allclose(norms, vmap_norms, rtol=1e-6, err_msg=method)
        for k in ("b", "v", "w"):
            np.testing.assert_allclose(summed[k], vmap_sum[k], rtol=1e-5, atol=1e-6, err_msg=method)


def test_ghost_coverage_and_auto_chunk_size_agree_across_batch_forms(forms):
    params, batches, _ = forms
    rows = {
        form: ghost_coverage(loss, params, jax.tree.map(lambda a: a[0], batch))
        for form, (loss, batch) in batches.items()
    }
    assert rows["tuple"] == rows["dict"] == rows["dataclass"]
    assert {(r.path, r.kind) for r in rows["dict"]} == {
        ("w", "dense"),
        ("b", "elementwise"),
        ("v", "dense"),
    }
    chunks = {
        form: auto_chunk_size(loss, params, batch, memory_budget=2**30)
        for form, (loss, batch) in batches.items()
    }
    assert chunks == {"tuple": 9, "dict": 9, "dataclass": 9}


def test_mismatched_batch_leaves_are_named_by_their_path(forms):
    params, batches, _ = forms
    bad = {"x": jnp.ones((8, 4)), "y": jnp.ones(7), "s": jnp.ones(8)}
    for call in (
        lambda: per_example_grads(dict_loss, params, bad),
        lambda: per_example_grad_norms(dict_loss, params, bad),
        lambda: clip_and_sum(dict_loss, params, bad, clip_norm=1.0),
        lambda: auto_chunk_size(dict_loss, params, bad),
    ):
        with pytest.raises(ValueError, match=r"batch\['s'\]: 8, batch\['x'\]: 8, batch\['y'\]: 7"):
            call()
    with pytest.raises(ValueError, match=r"batch\[1\]: 3"):
        per_example_grad_norms(tuple_loss, params, (jnp.ones((8, 4)), jnp.ones(3), jnp.ones(8)))
    with pytest.raises(ValueError, match=r"batch\.y: 2"):
        per_example_grad_norms(
            dataclass_loss, params, Example(jnp.ones((8, 4)), jnp.ones(2), jnp.ones(8))
        )
    with pytest.raises(ValueError, match=r"batch\['x'\]` is a scalar"):
        per_example_grad_norms(dict_loss, params, {"x": jnp.ones(()), "y": jnp.ones(3)})
    with pytest.raises(ValueError, match="`batch` has no arrays"):
        per_example_grad_norms(dict_loss, params, {})


def test_an_unregistered_dataclass_batch_says_how_to_register_it(forms):
    params, _, _ = forms

    @dataclasses.dataclass
    class Plain:
        x: jax.Array

    with pytest.raises(TypeError, match="register_dataclass"):
        per_example_grad_norms(lambda p, e: jnp.sum(e.x), params, Plain(jnp.ones((3, 4))))

"""Tests for jaxwise.privacy: DP-SGD self-checks, accounting against dp-accounting, training."""

import logging
import subprocess
import sys
from typing import Any

import dp_accounting
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import data, numerics, optim
from jaxwise.compilation import CompileBudget
from jaxwise.models import init_mlp, mlp_apply, mlp_loss
from jaxwise.per_example import clip_and_sum, per_example_grad_norms
from jaxwise.privacy import (
    PoissonSampler,
    add_dp_noise,
    dp_gradient,
    dp_gradient_accumulated,
    dp_gradient_fn,
    epsilon,
    make_dp_train_epoch,
    noise_multiplier_for,
    poisson_batch,
    shuffled_batches,
)
from jaxwise.train import ShuffleSampler, TrainState, make_epoch

LOSS = mlp_loss(lambda logits, y: -numerics.log_softmax(logits)[y])


@pytest.fixture
def problem():
    params = init_mlp(jax.random.key(0), (6, 12, 4))
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(32, 6)) * 3, jnp.float32)
    y = jnp.asarray(rng.integers(0, 4, 32), jnp.int32)
    return params, x, y


def test_infinite_clip_and_zero_noise_is_the_mean_gradient(problem):
    params, x, y = problem
    g, _, _, _ = dp_gradient(
        LOSS, params, (x, y), jax.random.key(0), clip_norm=float("inf"), noise_multiplier=0.0
    )
    mean = jax.grad(lambda p: jnp.mean(jax.vmap(LOSS, in_axes=(None, 0))(p, (x, y))))(params)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(mean)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_clipping_bounds_every_example_and_really_clips(problem):
    params, x, y = problem
    clip = 0.5
    norms = np.asarray(per_example_grad_norms(LOSS, params, (x, y)))
    assert (norms > clip).sum() >= 5 and (norms < clip).sum() >= 1
    for i in range(len(norms)):
        summed, _ = clip_and_sum(LOSS, params, (x[i : i + 1], y[i : i + 1]), clip_norm=clip)
        clipped = np.sqrt(sum(float(jnp.sum(leaf**2)) for leaf in jax.tree.leaves(summed)))
        assert clipped <= clip * (1 + 1e-5)
        if norms[i] > clip:
            assert clipped == pytest.approx(clip, rel=1e-5)
        else:
            assert clipped == pytest.approx(norms[i], rel=1e-5)


def test_noise_is_standard_normal_after_standardising():
    sigma, clip = 1.3, 0.7
    zeros = {"a": jnp.zeros(60_000), "b": jnp.zeros((200, 300))}
    noisy = add_dp_noise(zeros, jax.random.key(42), clip, sigma, batch_size=1)
    z = np.concatenate([np.asarray(leaf).ravel() for leaf in jax.tree.leaves(noisy)]) / (
        sigma * clip
    )
    assert z.size >= 100_000
    assert abs(z.mean()) < 0.01 and abs(z.std() - 1.0) < 0.01
    a, b = np.asarray(noisy["a"][:1000]), np.asarray(noisy["b"]).ravel()[:1000]
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.1  # leaves get different slices of the one draw
    halved = add_dp_noise(zeros, jax.random.key(42), clip, sigma, batch_size=2)
    np.testing.assert_allclose(np.asarray(halved["a"]), np.asarray(noisy["a"]) / 2, rtol=1e-6)


def test_dp_noise_std_is_sigma_c_over_b_over_many_draws():
    sigma, clip, batch = 1.1, 0.5, 64
    zeros = {"w": jnp.zeros((50, 40)), "b": jnp.zeros(40), "s": jnp.zeros(())}
    draw = jax.jit(jax.vmap(lambda k: add_dp_noise(zeros, k, clip, sigma, batch)))
    samples = draw(jax.random.split(jax.random.key(3), 200))  # 200 draws of 2,041 parameters
    flat = np.concatenate(
        [np.asarray(leaf, np.float64).reshape(200, -1) for leaf in jax.tree.leaves(samples)], 1
    )
    expected = sigma * clip / batch
    assert abs(flat.std() / expected - 1) < 0.02
    per_param = (
        flat.std(axis=0) / expected
    )  # every parameter, the scalar leaf included, gets the same noise
    assert abs(per_param.mean() - 1) < 0.02 and per_param.min() > 0.7
    corr = np.corrcoef(flat[:, :50].T)
    assert np.abs(corr[np.triu_indices(50, 1)]).max() < 0.35  # independent entries  # pyright: ignore[reportArgumentType, reportCallIssue]  # NumPy's stubs reject a triu_indices tuple index
    assert abs(np.corrcoef(flat[:, 0], flat[:, -1])[0, 1]) < 0.3


def test_noise_draw_is_one_random_kernel():
    zeros = {f"l{i}": jnp.zeros((8, 8)) for i in range(6)}
    jaxpr = str(jax.make_jaxpr(lambda k: add_dp_noise(zeros, k, 1.0, 1.0, 4))(jax.random.key(0)))
    assert jaxpr.count("random_bits") == 1 and "random_split" not in jaxpr


def test_same_key_same_result_different_key_different(problem):
    params, x, y = problem

    def run(k):
        key = jax.random.key(k)
        return dp_gradient(LOSS, params, (x, y), key, clip_norm=1.0, noise_multiplier=1.0)[0]

    a, b, c = run(1), run(1), run(2)
    for la, lb, lc in zip(jax.tree.leaves(a), jax.tree.leaves(b), jax.tree.leaves(c)):
        np.testing.assert_array_equal(np.asarray(la), np.asarray(lb))
        assert not np.allclose(np.asarray(la), np.asarray(lc))


def test_ghost_and_chunked_dp_gradients_agree(problem):
    params, x, y = problem
    key = jax.random.key(3)
    ref, ref_norms, _, _ = dp_gradient(
        LOSS, params, (x, y), key, clip_norm=1.0, noise_multiplier=0.8, method="vmap"
    )
    for kwargs in ({"method": "ghost"}, {"method": "auto"}, {"chunk_size": 5, "method": "chunked"}):
        g, norms, _, _ = dp_gradient(
            LOSS,
            params,
            (x, y),
            key,
            clip_norm=1.0,
            noise_multiplier=0.8,
            **kwargs,  # pyright: ignore[reportArgumentType]  # one of the method literals, from the loop
        )
        np.testing.assert_allclose(norms, ref_norms, rtol=1e-4)
        for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(ref)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-6)


def test_accumulation_adds_noise_once(problem):
    params, x, y = problem
    micro = (x.reshape(4, 8, 6), y.reshape(4, 8))
    clean_acc, norms, _, _ = dp_gradient_accumulated(
        LOSS,
        params,
        micro,
        jax.random.key(0),
        clip_norm=1.0,
        noise_multiplier=0.0,
        expected_batch_size=32,
    )
    clean, _, _, _ = dp_gradient(
        LOSS, params, (x, y), jax.random.key(0), clip_norm=1.0, noise_multiplier=0.0
    )
    for a, b in zip(jax.tree.leaves(clean_acc), jax.tree.leaves(clean)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
    assert norms.shape == (4, 8)
    sigma = 2.0
    samples = []
    noisy_fn = jax.jit(
        lambda k: dp_gradient_accumulated(
            LOSS,
            params,
            micro,
            k,
            clip_norm=1.0,
            noise_multiplier=sigma,
            expected_batch_size=32,
        )
    )
    for k in range(40):
        noisy, _, _, _ = noisy_fn(jax.random.key(k))
        samples.append(
            np.concatenate(
                [
                    (np.asarray(a) - np.asarray(b)).ravel()
                    for a, b in zip(jax.tree.leaves(noisy), jax.tree.leaves(clean))
                ]
            )
        )
    std = np.std(np.concatenate(samples)) * 32 / sigma
    assert 0.9 < std < 1.1  # once: σC/B; per micro-batch it would be √4 = 2 times larger
    masked, _, _, _ = dp_gradient_accumulated(
        LOSS,
        params,
        micro,
        jax.random.key(0),
        clip_norm=1.0,
        noise_multiplier=0.0,
        expected_batch_size=32,
        mask=jnp.ones((4, 8), bool).at[3].set(False),
    )
    first_three, _, _, _ = dp_gradient(
        LOSS,
        params,
        (x[:24], y[:24]),
        jax.random.key(0),
        clip_norm=1.0,
        noise_multiplier=0.0,
        expected_batch_size=32,
    )
    for a, b in zip(jax.tree.leaves(masked), jax.tree.leaves(first_three)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_epsilon_equals_dp_accounting(accountant):
    sigma, q, steps, delta = 1.1, 0.01, 500, 1e-5
    direct = (
        dp_accounting.rdp.RdpAccountant()
        if accountant == "rdp"
        else dp_accounting.pld.PLDAccountant()
    )
    direct.compose(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), steps
    )
    assert epsilon(
        noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant=accountant
    ) == pytest.approx(direct.get_epsilon(delta), rel=1e-9)
    assert epsilon(noise_multiplier=0.0, sample_rate=q, steps=steps, delta=delta) == float("inf")


def test_noise_multiplier_for_round_trips():
    q, steps, delta = 0.02, 1000, 1e-5
    for target in (0.5, 2.0, 8.0):
        sigma = noise_multiplier_for(epsilon=target, sample_rate=q, steps=steps, delta=delta)
        assert eps(sigma, q, steps, delta) <= target * (1 + 1e-3)
        assert eps(sigma * 0.97, q, steps, delta) > target


def test_pld_calibration_searches_near_the_answer():
    # dp-accounting's PLD of σ = 1e-3 at q = 256/60000 needs a 38 GiB array: the bisection
    # once started its bracket there (a MemoryError); it now starts from σ = 1, one octave
    q, steps, delta = 256 / 60000, 1000, 1e-5
    sigma = noise_multiplier_for(
        epsilon=0.5, sample_rate=q, steps=steps, delta=delta, accountant="pld"
    )
    assert eps(sigma, q, steps, delta, "pld") <= 0.5 * (1 + 1e-3)
    assert eps(sigma * 0.99, q, steps, delta, "pld") > 0.5


@pytest.mark.parametrize(
    "target, expected", [(3.0, (0.25, 0.5)), (0.3, (2.0, 4.0)), (1e4, (1e-3, 1e-3))]
)
def test_the_calibration_bracket_is_one_octave(target, expected):
    from jaxwise.privacy._accounting._accountant import _bracket

    assert _bracket(lambda sigma: 1 / sigma, target) == pytest.approx(expected)


def test_accounting_is_computed_once_per_process_for_the_same_values():
    from jaxwise.privacy._accounting._accountant import _memo

    sigma = noise_multiplier_for(epsilon=2.5, sample_rate=0.013, steps=517, delta=1e-5)
    hits = _memo.cache_info().hits
    again = noise_multiplier_for(epsilon=2.5, sample_rate=0.013, steps=np.int64(517), delta=1e-5)
    assert again == sigma
    assert eps(sigma, 0.013, 517, 1e-5) == eps(sigma, np.float64(0.013), 517, 1e-5)
    assert _memo.cache_info().hits == hits + 2

    class Scaled:  # a user's mutable mechanism: never memoized (it may change between calls)
        min_separation = 1
        factor = 2.0

        def init(self, params):
            return ()

        def correlate(self, state, z):
            return self.factor * z, state

        def dp_event(self, release, *, sample_rate, steps):
            event = dp_accounting.GaussianDpEvent(self.factor * release(1).noise_multiplier)
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.PoissonSampledDpEvent(sample_rate, event), steps
            )

    mech = Scaled()

    def of(mechanism):
        return epsilon(
            noise_multiplier=1.0, sample_rate=0.013, steps=517, delta=1e-5, mechanism=mechanism
        )

    first = of(mech)
    mech.factor = 4.0
    assert of(mech) < first


def eps(sigma, q, steps, delta, accountant: Any = "rdp"):
    return epsilon(
        noise_multiplier=sigma, sample_rate=q, steps=steps, delta=delta, accountant=accountant
    )


def sigma_for(target, delta, q, steps):
    return noise_multiplier_for(epsilon=target, sample_rate=q, steps=steps, delta=delta)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: eps(1.0, 0.0, 10, 1e-5), ValueError, "sample_rate"),
        (lambda: eps(1.0, 1.5, 10, 1e-5), ValueError, "sample_rate"),
        (lambda: eps(1.0, 0.1, 10, 0.0), ValueError, "delta"),
        (lambda: eps(1.0, 0.1, 10, 1.0), ValueError, "delta"),
        (lambda: eps(-1.0, 0.1, 10, 1e-5), ValueError, "noise_multiplier"),
        (lambda: eps(1.0, 0.1, 0, 1e-5), ValueError, "steps"),
        (lambda: eps(1.0, 0.1, 10, 1e-5, accountant="moments"), ValueError, "accountant"),
        (lambda: sigma_for(1e-9, 1e-5, 1.0, 10**6), ValueError, "unreachable"),
        (lambda: sigma_for(0.0, 1e-5, 0.1, 10), ValueError, "`epsilon`"),
        (lambda: epsilon(1.0, 0.1, 10, 1e-5), TypeError, "positional"),  # pyright: ignore[reportCallIssue]
        (lambda: noise_multiplier_for(1.0, 1e-5, 0.1, 10), TypeError, "positional"),  # pyright: ignore[reportCallIssue]
        (
            lambda: add_dp_noise({"a": jnp.zeros(2)}, jax.random.key(0), 0.0, 1.0, 1),
            ValueError,
            "clip_norm",
        ),
        (
            lambda: add_dp_noise({"a": jnp.zeros(2)}, jax.random.key(0), 1.0, -0.5, 1),
            ValueError,
            "noise_multiplier",
        ),
        (lambda: add_dp_noise({"a": jnp.zeros(2)}, 0, 1.0, 0.5, 1), TypeError, "key"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: poisson_batch(jax.random.key(0), 10, 0.0, 5), ValueError, "sample_rate"),
        (lambda: shuffled_batches(jax.random.key(0), 10, 11), ValueError, "batch_size"),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_dp_gradient_bad_batch(problem):
    params, x, y = problem
    key = jax.random.key(0)
    with pytest.raises(ValueError, match=r"batch\[0\]: 32, batch\[1\]: 3"):
        dp_gradient(LOSS, params, (x, y[:3]), key, clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(ValueError, match="chunk_size"):
        dp_gradient(LOSS, params, (x, y), key, clip_norm=1.0, noise_multiplier=1.0, chunk_size=-2)
    with pytest.raises(
        ValueError, match=r"axis 1\), got microbatches\['x'\]: 8, microbatches\['y'\]: 4"
    ):
        dp_gradient_accumulated(
            lambda p, e: LOSS(p, (e["x"], e["y"])),
            params,
            {"x": x.reshape(4, 8, 6), "y": y[:16].reshape(4, 4)},
            key,
            clip_norm=1.0,
            noise_multiplier=1.0,
            expected_batch_size=32,
        )


def test_poisson_batch_statistics():
    counts = [int(poisson_batch(jax.random.key(k), 2000, 0.05, 200)[1].sum()) for k in range(50)]
    assert abs(np.mean(counts) - 100) < 5 and np.std(counts) > 3
    idx, mask, over = poisson_batch(jax.random.key(0), 100, 0.9, 10)
    assert bool(over) and int(mask.sum()) == 10


def _train(epoch, state, data, epochs):
    for _ in range(epochs):
        state, metrics = epoch(state, data)
    return state, metrics  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs


@pytest.mark.parametrize(
    "sampler", [PoissonSampler(100), ShuffleSampler(100)], ids=["poisson", "shuffle"]
)
@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_dp_sgd_and_plain_sgd_exceed_90_percent_on_blobs(sampler):
    x, y = data.make_blobs(2000, 20, 10, seed=0)
    xtr, xte, ytr, yte = data.train_test_split(x, y, test_fraction=0.25, seed=1)
    train = (jnp.asarray(xtr), jnp.asarray(ytr))
    tx = optim.sgd(0.5, momentum=0.9)
    dp_epoch = make_epoch(dp_gradient_fn(LOSS, clip_norm=1.0, noise_multiplier=1.1), sampler)
    state = TrainState.create(init_mlp(jax.random.key(0), (20, 10)), tx, jax.random.key(1))
    with CompileBudget(1, dp_epoch, exact=True):
        state, metrics = _train(dp_epoch, state, train, 8)
    acc = float(jnp.mean(mlp_apply(state.params, jnp.asarray(xte)).argmax(-1) == jnp.asarray(yte)))
    assert acc > 0.9, acc
    assert not bool(metrics.get("overflow", jnp.zeros(1, bool)).any())
    steps = 8 * dp_epoch.steps_per_epoch(len(xtr))
    assert 0 < eps(1.1, dp_epoch.sample_rate(len(xtr)), steps, 1e-5) < 10

    plain = TrainState.create(init_mlp(jax.random.key(0), (20, 10)), tx, 1)
    loss = lambda p, b: numerics.cross_entropy(mlp_apply(p, b[0]), b[1])  # noqa: E731
    from jaxwise.train import make_train_epoch

    plain, _ = _train(make_train_epoch(loss, 100), plain, train, 8)
    assert (
        float(jnp.mean(mlp_apply(plain.params, jnp.asarray(xte)).argmax(-1) == jnp.asarray(yte)))
        > 0.9
    )


def test_dp_epoch_input_checks():
    tx = optim.sgd(0.1)
    epoch = make_dp_train_epoch(LOSS, 64, clip_norm=1.0, noise_multiplier=1.0)
    state = TrainState.create(init_mlp(0, (3, 2)), tx, 0)
    with pytest.raises(ValueError, match="larger than the dataset"):
        epoch(state, (jnp.ones((10, 3)), jnp.zeros(10, jnp.int32)))
    with pytest.raises(TypeError, match="`sampler` must be a jaxwise.train.Sampler"):
        make_epoch(dp_gradient_fn(LOSS, clip_norm=1.0, noise_multiplier=1.0), "uniform")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="method"):
        make_dp_train_epoch(LOSS, 4, clip_norm=1.0, noise_multiplier=1.0, method="x")  # pyright: ignore[reportArgumentType]  # bad input on purpose


def _linear_problem():
    rng = np.random.default_rng(7)
    w = jnp.asarray(rng.normal(size=3), jnp.float32)
    x = rng.normal(size=(12, 3)).astype(np.float32) * 2
    y = rng.normal(size=12).astype(np.float32)
    return w, x, y


def _clipped_mean64(w, x, y, clip):
    """The clipped mean gradient of ``(x·w − y)²`` in NumPy float64 (no noise)."""
    w64, x64, y64 = (np.asarray(a, np.float64) for a in (w, x, y))
    grads = 2 * (x64 @ w64 - y64)[:, None] * x64
    norms = np.linalg.norm(grads, axis=1)
    return (grads * np.minimum(1.0, clip / norms)[:, None]).sum(0), norms


@pytest.mark.parametrize("method", ["auto", "ghost", "vmap", "chunked"])
def test_dp_gradients_take_tuple_and_dict_batches_alike(method):
    w, x, y = _linear_problem()
    forms = {
        "tuple": (lambda p, e: (jnp.dot(e[0], p) - e[1]) ** 2, (jnp.asarray(x), jnp.asarray(y))),
        "dict": (
            lambda p, e: (jnp.dot(e["x"], p) - e["y"]) ** 2,
            {"x": jnp.asarray(x), "y": jnp.asarray(y)},
        ),
    }
    summed64, norms64 = _clipped_mean64(w, x, y, 1.5)
    chunk = 5 if method == "chunked" else None
    key = jax.random.key(0)
    for loss, batch in forms.values():
        g, norms, _, _ = dp_gradient(
            loss,
            w,
            batch,
            key,
            clip_norm=1.5,
            noise_multiplier=0.0,
            method=method,
            chunk_size=chunk,
        )
        np.testing.assert_allclose(np.asarray(g, np.float64), summed64 / 12, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(norms, np.float64), norms64, rtol=1e-5)
        micro = jax.tree.map(lambda a: a.reshape(3, 4, *a.shape[1:]), batch)
        g, norms, _, _ = dp_gradient_accumulated(
            loss,
            w,
            micro,
            key,
            clip_norm=1.5,
            noise_multiplier=0.0,
            method=method,
            chunk_size=chunk,
            expected_batch_size=12.0,
        )
        np.testing.assert_allclose(np.asarray(g, np.float64), summed64 / 12, rtol=1e-5)
        np.testing.assert_allclose(np.asarray(norms, np.float64), norms64.reshape(3, 4), rtol=1e-5)
    noisy = [
        dp_gradient(loss, w, batch, key, clip_norm=1.5, noise_multiplier=1.0, method=method)[0]
        for loss, batch in forms.values()
    ]
    np.testing.assert_array_equal(np.asarray(noisy[0]), np.asarray(noisy[1]))  # same noise


def test_accounting_is_keyword_only_and_prints_nothing(capfd, caplog):
    caplog.set_level(logging.DEBUG)  # pytest's handler would otherwise swallow absl's lines
    sigma = noise_multiplier_for(epsilon=8.0, sample_rate=64 / 1437, steps=660, delta=1e-5)
    value = epsilon(noise_multiplier=sigma, sample_rate=64 / 1437, steps=660, delta=1e-5)
    assert value == pytest.approx(8.0, rel=1e-2) and value <= 8.0 * (1 + 1e-3)
    epsilon(noise_multiplier=0.3, sample_rate=0.5, steps=10**4, delta=1e-5)  # orders excluded
    out, err = capfd.readouterr()
    assert out == "" and err == ""
    assert [r.getMessage() for r in caplog.records if r.name == "absl"] == []


def test_accounting_without_dp_accounting_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # as if not installed
    with pytest.raises(
        ImportError, match=r"jaxwise.privacy.epsilon needs dp_accounting.*\[privacy\]"
    ):
        epsilon(noise_multiplier=1.0, sample_rate=0.1, steps=10, delta=1e-5)
    with pytest.raises(ImportError, match=r"pip install 'jaxwise\[privacy\]'"):
        noise_multiplier_for(epsilon=1.0, sample_rate=0.1, steps=10, delta=1e-5)


@pytest.mark.slow
def test_import_privacy_does_not_import_dp_accounting():
    code = (
        "import sys; sys.modules['dp_accounting'] = None; import jaxwise.privacy; "
        "print(sorted(m for m in sys.modules if m.startswith('dp_accounting')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['dp_accounting']"  # only the blocked placeholder

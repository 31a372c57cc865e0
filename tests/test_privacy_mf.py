"""Correlated noise (BandMF, BLT), cyclic Poisson sampling, accounting and adaptive clipping."""

import importlib
import importlib.util
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from host64 import host_float64, on_host

from jaxwise import privacy
from jaxwise.privacy import (
    BLT,
    AdaptiveClip,
    BandMF,
    CyclicPoissonSampler,
    bandmf_strategy,
    blt_strategy,
    choose_mechanism,
)
from jaxwise.privacy._mechanisms._blt import blt_coefs
from jaxwise.privacy._mechanisms._toeplitz import minsep_sensitivity_squared

dp_accounting = pytest.importorskip("dp_accounting")

HAVE_JAX_PRIVACY = importlib.util.find_spec("jax_privacy") is not None  # a bench extra


def jp(module: str) -> Any:
    """A jax-privacy module (tests using it are marked `needs_jax_privacy`)."""
    return importlib.import_module(f"jax_privacy.{module}")


needs_jax_privacy = pytest.mark.skipif(
    not HAVE_JAX_PRIVACY, reason="jax-privacy (bench extra) is not importable"
)


@pytest.fixture
def standard_promotion():
    """jax-privacy mixes int32 and int64 internally: run it under standard promotion."""
    with jax.numpy_dtype_promotion("standard"):
        yield


def dense_toeplitz(coefs, n):
    """The lower-triangular Toeplitz n x n matrix with first column coefs (float64)."""
    c = np.zeros(n)
    c[: min(n, len(coefs))] = np.asarray(coefs, np.float64)[:n]
    return np.array([[c[i - j] if i >= j else 0.0 for j in range(n)] for i in range(n)])


def normalised_banded(coefs, n):
    """The column-normalised banded Toeplitz n x n strategy (float64): every column norm 1."""
    c = dense_toeplitz(coefs, n)
    return c / np.linalg.norm(c, axis=0)


def dense_loss(coefs, n, momentum=0.0):
    """Mean squared row norm of A C^-1 times the max column norm^2 of C, densely."""
    a = np.array(
        [(1 - momentum ** (k + 1)) / (1 - momentum) if momentum else 1.0 for k in range(n)]
    )
    workload = dense_toeplitz(a, n)
    c = dense_toeplitz(coefs, n)
    b = workload @ np.linalg.inv(c)
    return float(np.mean(np.sum(b**2, axis=1)) * np.max(np.sum(c**2, axis=0)))


# ---------------------------------------------------------------- the strategy


@pytest.mark.parametrize("n,bands,momentum", [(12, 3, 0.0), (30, 5, 0.0), (20, 4, 0.9)])
def test_strategy_matches_dense_float64_referee(n, bands, momentum):
    s = bandmf_strategy(n, bands, momentum=momentum)
    assert s.coefs.shape == (bands,) and s.coefs.dtype == np.float64
    assert math.isclose(float(s.coefs @ s.coefs), 1.0, rel_tol=1e-12)
    assert math.isclose(s.loss, dense_loss(s.coefs, n, momentum), rel_tol=1e-10)
    assert math.isclose(s.dpsgd_rmse**2, dense_loss([1.0], n, momentum), rel_tol=1e-10)
    assert s.rmse < s.dpsgd_rmse
    # a local optimum: perturbing any coefficient does not lower the dense loss
    for j in range(bands):
        for step in (1e-4, -1e-4):
            moved = s.coefs.copy()
            moved[j] += step
            assert dense_loss(moved, n, momentum) >= s.loss * (1 - 1e-12)


@pytest.mark.parametrize("momentum", [0.5, 0.9])
def test_two_band_momentum_strategy_is_the_grid_optimum_without_overflow(momentum):
    # Long momentum workloads: a line-search trial with c_1 > c_0 makes the recurrence C⁻¹
    # grow like (c_1/c_0)^n; it once overflowed (a RuntimeWarning) and L-BFGS stopped at its
    # starting point, 10% above the optimum. Referee: a fine grid over c_1/c_0 in float64.
    from jaxwise.privacy._mechanisms import _toeplitz

    n = 1050
    s = bandmf_strategy(n, 2, momentum=momentum)  # filterwarnings=error: no overflow
    workload = _toeplitz.workload_coefs(n, momentum)
    grid = min(
        _toeplitz.loss_and_grad(np.array([1.0, a]), workload)[0]
        for a in np.linspace(0.0, 1.0, 4001)
    )
    assert s.loss <= grid * (1 + 1e-9)
    assert 0.0 < s.coefs[1] < s.coefs[0]


def test_strategy_one_band_is_dpsgd():
    s = bandmf_strategy(50, 1)
    assert s.coefs.tolist() == [1.0]
    assert s.rmse == s.dpsgd_rmse and s.sensitivity == math.sqrt(50)


def _min_separated(n, sep):
    """Every participation pattern (sorted steps) with gaps of at least ``sep``."""
    out = [()]
    for t in range(n):
        out += [p + (t,) for p in out if not p or t - p[-1] >= sep]
    return [p for p in out if p]


@pytest.mark.parametrize("n,bands", [(13, 3), (11, 4), (9, 2)])
def test_strategy_sensitivity_is_the_normalised_dense_worst_case(n, bands):
    # brute force over every min-separated participation pattern (signs of the columns do
    # not matter: all entries are non-negative), on the float64 column-normalised matrix
    s = bandmf_strategy(n, bands)
    c = normalised_banded(s.coefs, n)
    worst = max(
        float(np.sum(c[:, list(p)], axis=1) @ np.sum(c[:, list(p)], axis=1))
        for p in _min_separated(n, bands)
    )
    assert math.isclose(s.sensitivity**2, worst, rel_tol=1e-12)
    # the un-normalised Toeplitz tail is smaller: the old figure under-used the budget
    assert minsep_sensitivity_squared(s.coefs, n, bands) < worst


@pytest.mark.parametrize("steps,bands", [(0, 1), (5, 0), (5, -1), (5, 6)])
def test_strategy_bad_bands(steps, bands):
    with pytest.raises(ValueError, match="steps|bands"):
        bandmf_strategy(steps, bands)
    with pytest.raises(ValueError, match="steps|bands"):
        BandMF(bands=bands, steps=steps)


def test_strategy_bad_types_and_momentum():
    with pytest.raises(TypeError, match="bands"):
        bandmf_strategy(10, 2.5)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="momentum"):
        bandmf_strategy(10, 2, momentum=1.0)


@needs_jax_privacy
@pytest.mark.parametrize("n,bands", [(64, 4), (200, 16)])
def test_strategy_agrees_with_jax_privacy(n, bands, standard_promotion):
    ours = bandmf_strategy(n, bands)
    # the peer's optimiser switches float64 on itself (jax.enable_x64): on the host
    with on_host():
        theirs = np.asarray(
            jp("matrix_factorization.toeplitz").optimize_banded_toeplitz(n, bands), np.float64
        )
        loss_ours = float(jp("matrix_factorization.toeplitz").loss(jnp.asarray(ours.coefs), n))
        loss_theirs = float(jp("matrix_factorization.toeplitz").loss(jnp.asarray(theirs), n))
        banded = jp("matrix_factorization.banded")
        strategy = banded.ColumnNormalizedBanded.from_banded_toeplitz(n, jnp.asarray(ours.coefs))
        sens = float(banded.minsep_sensitivity_squared(strategy, bands))
    assert loss_ours <= loss_theirs * (1 + 1e-6)
    assert math.isclose(ours.loss, loss_ours, rel_tol=1e-5)  # theirs evaluates in float32
    assert math.isclose(ours.sensitivity**2, sens, rel_tol=1e-12)


@needs_jax_privacy
def test_sensitivity_agrees_with_jax_privacy_in_float64(standard_promotion):
    with host_float64():
        for n, sep in [(30, 4), (100, 7), (64, 64)]:
            coefs = bandmf_strategy(n, min(sep, 8)).coefs
            theirs = float(
                jp("matrix_factorization.toeplitz").minsep_sensitivity_squared(
                    jnp.asarray(coefs), sep, None, n
                )
            )
            ours = minsep_sensitivity_squared(coefs, n, sep)
            assert abs(ours - theirs) <= 1e-9 * theirs


# ---------------------------------------------------------------- the mechanisms


def run_mechanism(mech, z):
    """Stream the (n, d) standard normals z through mech; the (n, d) noise."""
    state = mech.init({"w": jnp.zeros(z.shape[1])})
    out = []
    for t in range(z.shape[0]):
        noise, state = mech.correlate(state, {"w": jnp.asarray(z[t])})
        out.append(np.asarray(noise["w"], np.float64))
    return np.stack(out)


@pytest.mark.parametrize("n,bands", [(20, 4), (9, 8), (12, 2)])
def test_bandmf_streaming_matches_the_normalised_dense_inverse(rng, n, bands):
    # the streamed noise is C̃⁻¹z for the column-normalised C̃ (float64 NumPy referee); past
    # `steps` the strategy starts afresh: a block-diagonal C̃ (2 blocks and 3 steps here)
    mech = BandMF(bands=bands, steps=n)
    z = rng.standard_normal((2 * n + 3, 6)).astype(np.float32)
    c = normalised_banded(mech.strategy.coefs, n)
    blocks = [z[:n], z[n : 2 * n], z[2 * n :]]
    dense = np.concatenate(
        [np.linalg.solve(c[: len(b), : len(b)], b.astype(np.float64)) for b in blocks]
    )
    ours = run_mechanism(mech, z)
    np.testing.assert_allclose(ours, dense, rtol=1e-5, atol=1e-5)
    # the last bands − 1 steps are scaled down by the tail's column norms (the fix): the
    # plain Toeplitz inverse differs there and only there
    plain = np.linalg.solve(dense_toeplitz(mech.strategy.coefs, n), z[:n].astype(np.float64))
    np.testing.assert_allclose(ours[: n - bands + 1], plain[: n - bands + 1], rtol=1e-5, atol=1e-5)
    if bands > 1:
        assert np.abs(ours[n - bands + 1 : n] - plain[n - bands + 1 : n]).min() > 1e-4


def test_bandmf_noise_covariance_is_cinv_cinv_t():
    n, d = 8, 40000
    mech = BandMF(bands=3, steps=n)
    z = np.asarray(jax.random.normal(jax.random.key(3), (n, d)))
    noise = run_mechanism(mech, z)
    cinv = np.linalg.inv(normalised_banded(mech.strategy.coefs, n))
    # the d coordinates are d independent realisations of the n-step noise
    expected = cinv @ cinv.T
    # the standard error of a covariance over d samples is about sqrt(2 / d) of its scale
    np.testing.assert_allclose(noise @ noise.T / d, expected, atol=0.04 * np.abs(expected).max())
    assert np.abs(expected - np.diag(np.diag(expected))).max() > 0.3  # truly correlated


def test_bandmf_one_band_returns_z_itself():
    mech = BandMF(bands=1, steps=5)
    z = {"w": jax.random.normal(jax.random.key(0), (7,))}
    state = mech.init({"w": jnp.zeros(7)})
    noise, new = mech.correlate(state, z)
    assert state == () and new == () and noise is z


def test_bandmf_state_follows_params_structure_and_dtype():
    mech = BandMF(bands=4, steps=10)
    params = {"a": jnp.zeros((2, 3)), "b": jnp.zeros(5, jnp.bfloat16)}
    state = mech.init(params)
    assert state["buffers"]["a"].shape == (3, 2, 3)
    assert state["buffers"]["b"].dtype == jnp.bfloat16
    z = jax.tree.map(lambda p: jnp.ones(p.shape, p.dtype), params)
    noise, new = mech.correlate(state, z)
    assert jax.tree.structure(new) == jax.tree.structure(state)
    assert noise["b"].dtype == jnp.bfloat16


@pytest.mark.parametrize(
    "mech", [BandMF(bands=4, steps=10), BLT(buffers=2, steps=10, min_sep=4)], ids=["bandmf", "blt"]
)
def test_the_noise_correlation_contracts_its_buffers_at_highest_precision(
    mech, backend_default_precision
):
    """The buffered noise is contracted at HIGHEST whatever the default matmul precision: a
    TPU's default (one bfloat16 pass) would round the noise the correlation subtracts."""
    params = {"w": jnp.zeros((3, 5))}
    state, z = mech.init(params), {"w": jnp.ones((3, 5))}
    jaxpr = jax.make_jaxpr(mech.correlate)(state, z)
    dots = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "dot_general"]
    assert dots and all(e.params["precision"] == (jax.lax.Precision.HIGHEST,) * 2 for e in dots), [
        e.params["precision"] for e in dots
    ]


def test_the_ring_write_takes_a_finished_value_so_xla_can_update_the_buffers_in_place():
    """BandMF writes one slot of its ring buffers a step; the value written goes through an
    optimization barrier, so no backend can fuse the contraction that reads the buffers into
    the write (that fusion could not update the buffers in place: a copy of all of them)."""
    mech = BandMF(bands=4, steps=8)
    params = {"w": jnp.zeros((3, 5)), "b": jnp.zeros(5)}
    jaxpr = jax.make_jaxpr(mech.correlate)(mech.init(params), jax.tree.map(jnp.ones_like, params))
    eqns = jaxpr.jaxpr.eqns
    barriers = {v for e in eqns if e.primitive.name == "optimization_barrier" for v in e.outvars}
    writes = [  # jax.lax.dynamic_update_index_in_dim is a nested jit of the write
        e
        for e in eqns
        if e.primitive.name == "dynamic_update_slice"
        or e.params.get("name") == "dynamic_update_index_in_dim"
    ]
    assert len(writes) == 2  # one slot of each leaf's ring
    produced: dict[object, object] = {v: e for e in eqns for v in e.outvars}
    for write in writes:
        update = write.invars[1]
        while update not in barriers:  # through reshapes and casts only
            source = produced[update]
            assert isinstance(source, type(write))
            passing = {"reshape", "broadcast_in_dim", "convert_element_type"}
            assert source.primitive.name in passing, source.primitive.name
            update = source.invars[0]


@needs_jax_privacy
def test_bandmf_streaming_agrees_with_jax_privacy(rng, standard_promotion):
    n, bands = 24, 5
    mech = BandMF(bands=bands, steps=n)
    z = rng.standard_normal((n, 4)).astype(np.float32)
    strategy = jp("matrix_factorization.banded").ColumnNormalizedBanded.from_banded_toeplitz(
        n, jnp.asarray(mech.strategy.coefs, jnp.float32)
    )
    cinv = strategy.inverse_as_streaming_matrix()
    theirs = np.asarray(
        jp("matrix_factorization.streaming_matrix").multiply_array(cinv, jnp.asarray(z)), np.float64
    )
    np.testing.assert_allclose(run_mechanism(mech, z), theirs, rtol=1e-6, atol=1e-6)


def test_blt_streaming_matches_dense_inverse(rng):
    n = 16
    mech = BLT(buffers=2, steps=n, min_sep=4)
    s = mech.strategy
    c = dense_toeplitz(blt_coefs(s.decays, s.scales, n), n)
    z = rng.standard_normal((n, 5)).astype(np.float32)
    dense = s.sensitivity * np.linalg.solve(c, z.astype(np.float64))
    np.testing.assert_allclose(run_mechanism(mech, z), dense, rtol=1e-4, atol=1e-4)
    # scaled to sensitivity 1 under the participation: the worst min-separated sum of columns
    scaled = c / s.sensitivity
    worst = max(
        np.sum(scaled[:, list(range(st, n, 4))], axis=1)
        @ np.sum(scaled[:, list(range(st, n, 4))], axis=1)
        for st in range(4)
    )
    assert math.isclose(worst, 1.0, rel_tol=1e-9)
    assert s.rmse < s.dpsgd_rmse


@needs_jax_privacy
def test_blt_sensitivity_agrees_with_jax_privacy(standard_promotion):
    s = blt_strategy(3, 40, min_sep=40)  # single participation: Lemma 5.3's closed form
    with host_float64():
        theirs = jp("matrix_factorization.buffered_toeplitz").BufferedToeplitz.build(
            s.decays, s.scales
        )
        closed = float(jp("matrix_factorization.buffered_toeplitz").sensitivity_squared(theirs, 40))
        coefs = np.asarray(theirs.toeplitz_coefs(40))
    assert abs(s.sensitivity**2 - closed) <= 1e-9 * closed
    np.testing.assert_allclose(blt_coefs(s.decays, s.scales, 40), coefs, rtol=1e-12)


def _old_blt_loss(u, buffers, n, min_sep):
    """The BLT objective as the previous release computed it: dense coefficients, O(n²)."""
    from jaxwise.privacy._mechanisms import _blt, _toeplitz

    decays, scales = _blt._unpack(u, buffers)
    coefs = blt_coefs(decays, scales, n)
    workload = np.ones(n)
    sens2 = float(
        max(
            np.sum(dense_toeplitz(coefs, n)[:, list(range(st, n, min_sep))], axis=1) ** 2
            @ np.ones(n)
            for st in range(min_sep)
        )
    )
    return _toeplitz.mean_error(coefs, workload) * sens2, sens2


@pytest.mark.parametrize("buffers,n,min_sep", [(2, 30, 4), (3, 25, 1), (1, 40, 40)])
def test_blt_rational_loss_and_gradient_match_the_dense_float64_referee(buffers, n, min_sep):
    # the O(n · buffers) rational filter P/Q: the same loss and sensitivity as the dense
    # Toeplitz matrix, and a gradient equal to central differences of the dense loss
    from jaxwise.privacy._mechanisms import _blt

    u = np.random.default_rng(buffers).normal(size=2 * buffers + 1)
    loss, sens2, grad = _blt._loss_and_grad(u, buffers, np.ones(n), min_sep)
    dense_loss_, dense_sens2 = _old_blt_loss(u, buffers, n, min_sep)
    assert math.isclose(loss, dense_loss_, rel_tol=1e-10)
    assert math.isclose(sens2, dense_sens2, rel_tol=1e-12)
    h = 1e-6
    numeric = [
        (
            _old_blt_loss(u + h * e, buffers, n, min_sep)[0]
            - _old_blt_loss(u - h * e, buffers, n, min_sep)[0]
        )
        / (2 * h)
        for e in np.eye(u.shape[0])
    ]
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-6 * abs(loss))


def test_blt_strategy_is_at_least_as_good_as_the_dense_optimiser():
    # referee: the previous release's optimiser (numeric gradients of the dense loss)
    from scipy import optimize

    buffers, n, min_sep = 2, 40, 4
    u0 = np.concatenate([np.linspace(4.0, -1.0, buffers), np.zeros(buffers), [0.0]])
    old = optimize.minimize(
        lambda u: _old_blt_loss(u, buffers, n, min_sep)[0],
        u0,
        method="L-BFGS-B",
        options={"maxiter": 500, "ftol": 1e-13},
    )
    s = blt_strategy(buffers, n, min_sep=min_sep)
    assert s.loss <= old.fun * (1 + 1e-9)
    assert math.isclose(s.loss, old.fun, rel_tol=1e-6)


class _Taps:
    """A stand-in for scipy.signal recording the taps of every filter run."""

    def __init__(self, interrupt_after=None):
        import scipy.signal

        self.signal, self.taps, self.calls = scipy.signal, [], 0
        self.interrupt_after = interrupt_after

    def lfilter(self, b, a, x, *args, **kwargs):
        self.calls += 1
        if self.interrupt_after is not None and self.calls > self.interrupt_after:
            raise KeyboardInterrupt
        self.taps.append(max(np.size(b), np.size(a)))
        return self.signal.lfilter(b, a, x, *args, **kwargs)


@pytest.mark.parametrize("kind", ["bandmf", "blt", "sensitivity", "mean_error"])
def test_strategy_work_is_linear_in_the_steps(monkeypatch, kind):
    # every filter run has at most bands (or buffers + 1) taps: O(steps · bands) work; the
    # coefficients were padded to `steps` (an O(steps²) filter: BandMF(8, 10**6) hung)
    from jaxwise.privacy._mechanisms import _bandmf, _blt, _toeplitz

    taps = _Taps()
    monkeypatch.setattr(_toeplitz, "_signal", lambda: taps)
    steps = 4096
    if kind == "bandmf":
        _bandmf._optimise.__wrapped__(steps, 8, 0.0)
    elif kind == "blt":
        _blt._optimise.__wrapped__(3, steps, 64, 0.0)
    elif kind == "sensitivity":
        minsep_sensitivity_squared(np.array([0.6, 0.5, 0.4, 0.3]), steps, 4)
    else:
        _toeplitz.mean_error(np.array([0.6, 0.5, 0.4, 0.3]), np.ones(steps))
    assert taps.taps and max(taps.taps) <= 8


@pytest.mark.parametrize("kind", ["bandmf", "blt"])
def test_ctrl_c_inside_the_strategy_optimiser_propagates(monkeypatch, kind):
    from jaxwise.privacy._mechanisms import _bandmf, _blt, _toeplitz

    taps = _Taps(interrupt_after=20)
    monkeypatch.setattr(_toeplitz, "_signal", lambda: taps)
    with pytest.raises(KeyboardInterrupt):
        if kind == "bandmf":
            _bandmf._optimise.__wrapped__(512, 4, 0.0)
        else:
            _blt._optimise.__wrapped__(2, 512, 8, 0.0)


def test_progress_shows_a_bar_only_after_its_delay(capsys):
    from jaxwise.privacy._mechanisms._toeplitz import StrategyProgress

    with StrategyProgress("quick", after=3600.0) as progress:
        progress(1.0)
    assert capsys.readouterr().err == ""
    pytest.importorskip("rich")
    with StrategyProgress("slow strategy", after=0.0) as progress:
        progress(2.5)
        progress(1.25)
    err = capsys.readouterr().err
    assert "slow strategy" in err and "1.25" in err


@pytest.mark.parametrize("buffers", [0, 5, -1])
def test_blt_bad_buffers(buffers):
    with pytest.raises(ValueError, match="buffers"):
        BLT(buffers=buffers, steps=10)
    with pytest.raises(ValueError, match="buffers"):
        blt_strategy(buffers, 10)


# ---------------------------------------------------------------- cyclic Poisson sampling


def test_cyclic_sampler_separates_participations():
    n, groups = 203, 5
    sampler = CyclicPoissonSampler(10, groups=groups)
    sampler.check(n)
    (keys, group), _ = sampler.plan(jax.random.key(0), jnp.int32(7), n)
    assert group.tolist()[:6] == [2, 3, 4, 0, 1, 2]
    last = {}
    for t in range(sampler.steps(n)):
        idx, mask, drawn = sampler.draw((keys[t], group[t]), n)
        idx, mask = np.asarray(idx), np.asarray(mask)
        assert idx.shape == (sampler.width(n),) and not bool(drawn["overflow"])
        assert (idx[~mask] == n).all()  # padding never reads a real row
        real = idx[mask]
        assert (real < n).all() and (real % groups == int(group[t])).all()
        assert len(set(real.tolist())) == len(real)
        for i in real.tolist():
            assert t - last.get(i, -groups) >= groups
            last[i] = t


def test_cyclic_sampler_rate_and_ladder():
    sampler = CyclicPoissonSampler(16, groups=4)
    assert sampler.sample_rate(1000) == 16 / 250
    widths = sampler.widths(1000)
    assert list(widths) == sorted(widths) and widths[-1] == sampler.width(1000)
    assert CyclicPoissonSampler(64).widths(60000) == privacy.PoissonSampler(64).widths(60000)


def test_cyclic_sampler_empirical_rate():
    n, sampler = 400, CyclicPoissonSampler(20, groups=4)
    (keys, group), _ = sampler.plan(jax.random.key(1), jnp.int32(0), n)
    counts = [int(sampler.draw((keys[t], group[t]), n)[1].sum()) for t in range(len(group))]
    assert abs(np.mean(counts) - 20) < 4


def test_cyclic_sampler_bad_input():
    with pytest.raises(ValueError, match="groups"):
        CyclicPoissonSampler(4, groups=0)
    with pytest.raises(TypeError, match="groups"):
        CyclicPoissonSampler(4, groups=2.0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="groups"):
        CyclicPoissonSampler(10, groups=4).check(30)


# ---------------------------------------------------------------- accounting


def dpsgd_eps(sigma, q, compositions, delta):
    acc = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
    acc.compose(event, compositions)
    return acc.get_epsilon(delta)


def test_epsilon_bandmf_is_amplified_dpsgd_event():
    kw = {"noise_multiplier": 1.3, "sample_rate": 0.04, "steps": 101, "delta": 1e-5}
    assert privacy.epsilon(**kw, mechanism=BandMF(bands=1, steps=101)) == privacy.epsilon(**kw)
    eps = privacy.epsilon(**kw, mechanism=BandMF(bands=4, steps=101))
    assert math.isclose(eps, dpsgd_eps(1.3, 0.04, 26, 1e-5), rel_tol=1e-12)


def test_epsilon_blt_is_one_gaussian():
    blt = BLT(buffers=2, steps=40, min_sep=10)
    eps = privacy.epsilon(
        noise_multiplier=2.0, sample_rate=1.0, steps=40, delta=1e-5, mechanism=blt
    )
    acc = dp_accounting.rdp.RdpAccountant()
    acc.compose(dp_accounting.GaussianDpEvent(2.0))
    assert math.isclose(eps, acc.get_epsilon(1e-5), rel_tol=1e-12)
    with pytest.raises(ValueError, match="steps"):
        privacy.epsilon(noise_multiplier=2.0, sample_rate=1.0, steps=41, delta=1e-5, mechanism=blt)


def test_epsilon_adaptive_clip_counts_the_count_noise():
    clip = AdaptiveClip(initial=1.0, count_noise=3.0)
    kw = {"sample_rate": 0.01, "steps": 200, "delta": 1e-5}
    eff = (1.1**-2 + (2 * 3.0) ** -2) ** -0.5
    got = privacy.epsilon(noise_multiplier=1.1, **kw, clip=clip)
    assert math.isclose(got, privacy.epsilon(noise_multiplier=eff, **kw), rel_tol=1e-12)
    assert got > privacy.epsilon(noise_multiplier=1.1, **kw)
    sigma = privacy.noise_multiplier_for(epsilon=got, **kw, clip=clip)
    assert math.isclose(sigma, 1.1, rel_tol=2e-3)


def test_noise_multiplier_for_bandmf_round_trip():
    mech = BandMF(bands=4, steps=100)
    kw = {"sample_rate": 0.05, "steps": 100, "delta": 1e-5, "mechanism": mech}
    sigma = privacy.noise_multiplier_for(epsilon=2.0, **kw)
    assert privacy.epsilon(noise_multiplier=sigma, **kw) <= 2.0 + 1e-3
    # a quarter of the compositions at the same rate: less noise than DP-SGD
    assert sigma < privacy.noise_multiplier_for(
        epsilon=2.0, sample_rate=0.05, steps=100, delta=1e-5
    )


def test_accounting_bad_mechanism_and_clip():
    kw = {"noise_multiplier": 1.0, "sample_rate": 0.1, "steps": 10, "delta": 1e-5}
    with pytest.raises(TypeError, match="mechanism"):
        privacy.epsilon(**kw, mechanism="bandmf")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="clip"):
        privacy.epsilon(**kw, clip=1.0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="count_noise"):
        privacy.noise_multiplier_for(
            epsilon=0.5,
            sample_rate=0.1,
            steps=10,
            delta=1e-5,
            clip=AdaptiveClip(1.0, count_noise=0.1),
        )


@needs_jax_privacy
@pytest.mark.parametrize("bands", [1, 4])
def test_epsilon_agrees_with_jax_privacy(bands, standard_promotion):
    n, batch, steps, sigma = 6000, 60, 250, 1.2
    params = jp("accounting.analysis").DpParams(
        noise_multipliers=sigma, num_samples=n, delta=1e-6, batch_size=batch, cycle_length=bands
    )
    accountant = jp("accounting.analysis").DpsgdTrainingAccountant(
        jp("accounting.accountants").RdpAccountantConfig()
    )
    theirs = accountant.compute_epsilon(steps, params)
    sampler = CyclicPoissonSampler(batch, groups=bands)
    ours = privacy.epsilon(
        noise_multiplier=sigma,
        sample_rate=sampler.sample_rate(n),
        steps=steps,
        delta=1e-6,
        mechanism=BandMF(bands=bands, steps=steps),
    )
    assert abs(ours - theirs) <= 1e-6 * theirs


# ---------------------------------------------------------------- choosing the mechanism


def test_choose_mechanism_is_never_worse_than_dpsgd():
    choice = choose_mechanism(
        120, epsilon=8.0, delta=1e-5, n=1200, batch_size=60, bands=(1, 2, 4), blt_buffers=(2,)
    )
    names = [c.name for c in choice.candidates]
    assert names == ["dpsgd", "bandmf", "bandmf", "blt"]
    dpsgd = choice.candidates[0]
    assert dpsgd.mechanism is None and dpsgd.relative == 1.0
    assert choice.best.expected_error == min(c.expected_error for c in choice.candidates)
    assert choice.best.relative < 1.0  # at ε = 8 correlated noise wins
    for c in choice.candidates[1:3]:
        assert isinstance(c.mechanism, BandMF)
        assert math.isclose(c.expected_error, c.noise_multiplier * c.mechanism.strategy.rmse)


def test_choose_mechanism_skips_impossible_bands():
    choice = choose_mechanism(
        10, epsilon=3.0, delta=1e-5, n=100, batch_size=40, bands=(2, 4, 16), blt_buffers=()
    )
    assert [c.groups for c in choice.candidates] == [1, 2]


# ---------------------------------------------------------------- adaptive clipping


def test_adaptive_clip_update_matches_numpy():
    policy = AdaptiveClip(initial=2.0, target_quantile=0.3, learning_rate=0.5, count_noise=4.0)
    norms = jnp.asarray([0.5, 1.0, 3.0, 9.0, 0.1, 2.0])
    mask = jnp.asarray([True, True, True, False, True, True])
    normal = jax.random.normal(jax.random.key(7), (), jnp.float32)
    new = policy.update(policy.init(), norms, mask, normal, 5.0)
    noise = 4.0 * float(normal)
    # 0.5, 1.0, 0.1, 2.0 are <= 2.0 (+1/2 each), 3.0 is above (-1/2); 9.0 is padding
    fraction = min(1.0, max(0.0, (4 * 0.5 - 0.5 + noise) / 5.0 + 0.5))
    expected = 2.0 * math.exp(-0.5 * (fraction - 0.3))
    assert math.isclose(float(policy.norm(new)), expected, rel_tol=1e-5)


@pytest.mark.parametrize("removed", [0, 5], ids=["unclipped", "clipped"])
def test_adaptive_clip_count_has_the_accounted_sensitivity_one_half(removed):
    # The accountant (effective_noise_multiplier) treats the count as a Gaussian query of
    # sensitivity 1/2 (the (2·count_noise)⁻² term, Andrew et al.; TF Privacy centres the
    # indicators at ±1/2). Removing any one example must move the released sum by exactly 1/2
    # (an uncentred 0/1 count moved by 1 for an unclipped example: ε under-reported).
    policy = AdaptiveClip(initial=1.0, target_quantile=0.5, learning_rate=1.0, count_noise=1.0)
    norms = jnp.asarray([0.5] * 5 + [2.0] * 5)
    normal, expected = jax.random.normal(jax.random.key(3), (), jnp.float32), 10.0

    def released(mask):  # the noisy sum, recovered from the geometric update
        new = float(policy.norm(policy.update(policy.init(), norms, mask, normal, expected)))
        return (0.5 - math.log(new)) * expected - 0.5 * expected

    full = jnp.ones(10, bool)
    change = abs(released(full) - released(full.at[removed].set(False)))
    assert change == pytest.approx(0.5, rel=1e-4)


def test_adaptive_clip_tracks_the_quantile():
    policy = AdaptiveClip(initial=0.1, target_quantile=0.5, learning_rate=0.2, count_noise=1.0)
    state = policy.init()
    update = jax.jit(policy.update)
    for t in range(300):
        norms = jnp.exp(jax.random.normal(jax.random.key(t), (256,)))  # median 1.0
        state = update(state, norms, None, jax.random.normal(jax.random.key(10_000 + t)), 256.0)
    assert abs(float(policy.norm(state)) - 1.0) < 0.15


@pytest.mark.parametrize(
    "kwargs,name",
    [
        ({"initial": 0.0}, "initial"),
        ({"initial": float("inf")}, "initial"),
        ({"initial": 1.0, "target_quantile": 0.0}, "target_quantile"),
        ({"initial": 1.0, "target_quantile": 1.0}, "target_quantile"),
        ({"initial": 1.0, "learning_rate": 0.0}, "learning_rate"),
        ({"initial": 1.0, "count_noise": -1.0}, "count_noise"),
    ],
)
def test_adaptive_clip_bad_input(kwargs, name):
    with pytest.raises(ValueError, match=name):
        AdaptiveClip(**kwargs)


@pytest.mark.parametrize("mech", [BandMF(bands=4, steps=12), BLT(buffers=2, steps=12, min_sep=3)])
def test_mechanism_scans_with_one_compile(mech):
    from jaxwise.compilation import CompileBudget

    params = {"w": jnp.zeros((2, 3))}

    def stream(state, zs):
        return jax.lax.scan(lambda s, z: mech.correlate(s, {"w": z})[::-1], state, zs)

    run = jax.jit(stream)
    zs = jax.random.normal(jax.random.key(0), (12, 2, 3))
    init = jax.block_until_ready(mech.init(params))
    with CompileBudget(1) as budget:
        s1, out1 = run(init, zs)
        s2, out2 = run(s1, zs)  # a second call with the carried buffers: no recompile
    assert budget.count == 1
    dense = run_mechanism(mech, np.asarray(zs).reshape(12, 6)).reshape(12, 2, 3)
    np.testing.assert_allclose(np.asarray(out1["w"]), dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("noise", [None, BandMF(bands=1, steps=4)])
def test_the_one_noising_step_is_dpsgd_bit_for_bit(noise):
    from jaxwise.privacy._mechanisms._noise import flat_zeros, noise_step, noisy_mean

    summed = {"a": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(4)}
    key = jax.random.key(11)
    state = () if noise is None else noise.init(flat_zeros(summed))

    @jax.jit
    def both(summed, key):
        noisy, _, _ = noise_step(summed, key, state, noise=noise, std=0.7 * 1.3)
        ours = noisy_mean(noisy, None, 0.0, 5.0)
        return ours, privacy.add_dp_noise(summed, key, 0.7, 1.3, 5.0)

    ours, theirs = both(summed, key)
    for a, b in zip(jax.tree.leaves(ours), jax.tree.leaves(theirs)):
        assert np.array_equal(np.asarray(a), np.asarray(b))


def test_the_one_noising_step_adds_the_streamed_noise_float64_referee():
    from jaxwise.privacy._mechanisms._noise import flat_zeros, noise_step, standard_normal

    mech = BandMF(bands=3, steps=6)
    summed = {"w": jnp.zeros(5)}
    state = mech.init(flat_zeros(summed))
    zs, outs = [], []
    for t in range(6):
        key = jax.random.key(t)
        clip = jnp.float32(0.5 + t)  # a traced clip norm, as an adaptive policy gives
        noisy, state, _ = noise_step(summed, key, state, noise=mech, std=2.0 * clip)
        zs.append(np.asarray(standard_normal(key, summed)["w"], np.float64))
        outs.append(np.asarray(noisy["w"], np.float64) / (2.0 * (0.5 + t)))
    # the dense float64 referee: x = C̃⁻¹ z with C̃ the column-normalised banded strategy
    c = normalised_banded(mech.strategy.coefs, 6)
    np.testing.assert_allclose(np.stack(outs), np.linalg.solve(c, np.stack(zs)), rtol=2e-5)


# ---------------------------------------------------------------------------
# The mechanisms as plug-ins of the composed epoch (dp_gradient_fn × sampler → make_epoch)
# ---------------------------------------------------------------------------


def _wire_loss(p, ex):
    return (ex["x"] @ p["w"] - ex["y"]) ** 2


def _wire_data():
    x = jax.random.normal(jax.random.key(0), (64, 3))
    return {"x": x, "y": x @ jnp.asarray([1.0, -2.0, 0.5])}


def _wired(noise: Any, clip: Any = 1.0, groups: int = 1) -> Any:
    from jaxwise import optim, train

    gradient = privacy.dp_gradient_fn(_wire_loss, clip_norm=clip, noise_multiplier=1.0, noise=noise)
    sampler = privacy.CyclicPoissonSampler(8, groups=groups)
    state = train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0, gradient=gradient)
    return train.make_epoch(gradient, sampler), state


def _bits(tree):
    return [
        np.asarray(
            jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x
        ).tobytes()
        for x in jax.tree.leaves(tree)
    ]


def _two_epochs_compiled_once(epoch, state, noise):
    """Two epochs in one compilation: finite, nothing skipped, the noise buffers advanced."""
    from jaxwise.compilation import CompileBudget
    from jaxwise.tree import host_copy

    first = host_copy(state.gradient_state)  # a real copy: a NumPy view would block donation
    with CompileBudget(1, epoch, exact=True):
        state, metrics = epoch(state, _wire_data())
        state, metrics = epoch(state, _wire_data())
    assert np.isfinite(np.asarray(state.params["w"])).all()
    assert int(np.asarray(metrics["skipped"]).sum()) == 0
    if noise is not None and jax.tree.leaves(first):  # the buffers advanced
        assert _bits(state.gradient_state) != _bits(first)
    return state


# fixed-clip DP-SGD and BandMF(1): test_bandmf_of_one_band_is_dpsgd_bit_for_bit_in_an_epoch
@pytest.mark.parametrize(
    "noise, groups, adaptive",
    [
        (BandMF(4, steps=16), 4, False),
        (BLT(2, steps=16), 1, False),
        (None, 1, True),
        (BandMF(1, steps=16), 1, True),
        (BandMF(4, steps=16), 4, True),
        (BLT(2, steps=16), 1, True),
    ],
    ids=[
        "fixed-bandmf4",
        "fixed-blt2",
        "adaptive-dpsgd",
        "adaptive-bandmf1",
        "adaptive-bandmf4",
        "adaptive-blt2",
    ],
)
def test_mechanisms_train_through_make_epoch_once_compiled(noise, groups, adaptive):
    epoch, state = _wired(noise, AdaptiveClip(1.0) if adaptive else 1.0, groups)
    _two_epochs_compiled_once(epoch, state, noise)


def test_bandmf_of_one_band_is_dpsgd_bit_for_bit_in_an_epoch():
    # and each trains through make_epoch once compiled (the fixed-clip cases of the test above)
    one_band = BandMF(1, steps=16)
    plain, s1 = _wired(None)
    banded, s2 = _wired(one_band)
    s1 = _two_epochs_compiled_once(plain, s1, None)
    s2 = _two_epochs_compiled_once(banded, s2, one_band)
    assert _bits(s1.params) == _bits(s2.params) and _bits(s1.key) == _bits(s2.key)


def test_adaptive_clip_norm_falls_when_every_example_is_unclipped():
    # per-example gradient norms are far below the initial clip norm: the unclipped fraction is
    # ~1 > target 0.5, so the geometric update shrinks the clip norm every step
    # (a count noise far below the batch of 8: the count's signal decides every step)
    epoch, state = _wired(None, AdaptiveClip(100.0, target_quantile=0.5, count_noise=0.1), 1)
    state, metrics = epoch(state, _wire_data())
    final = float(state.gradient_state["clip"]["clip_norm"])
    assert final < 100.0 * 0.99
    norms = np.asarray(metrics["clip_norm"])
    assert norms[-1] < norms[0]


def test_adaptive_step_noise_is_the_fixed_steps_and_its_count_the_next_normal():
    # one standard-normal draw per step: the gradient's part first (the fixed-clip step's
    # noise for the same key), the count's noise the entry after the gradient's padded block
    from jaxwise import train
    from jaxwise.privacy._mechanisms._noise import flat_normal, flat_size

    params, data, key = {"w": jnp.zeros(3)}, _wire_data(), jax.random.key(5)
    batch = {"x": data["x"][:8], "y": data["y"][:8]}
    # float64: the per-example gradient norms at w = 0 (loss y², gradient -2·y·x)
    x64, y64 = np.asarray(batch["x"], np.float64), np.asarray(batch["y"], np.float64)
    norms = np.linalg.norm(-2 * y64[:, None] * x64, axis=1)
    initial = float(np.median(norms))  # half the examples below: the count is not saturated
    policy = AdaptiveClip(initial, target_quantile=0.4, learning_rate=0.3, count_noise=1.0)
    fixed = privacy.dp_gradient_fn(_wire_loss, clip_norm=initial, noise_multiplier=1.0)
    adaptive = privacy.dp_gradient_fn(_wire_loss, clip_norm=policy, noise_multiplier=1.0)
    # the batch's 8 rows as the divisor, each gradient's own accounting in its context
    at = train.StepContext(8.0, privacy=fixed.requirements.privacy)
    ab = train.StepContext(8.0, privacy=adaptive.requirements.privacy)
    a = fixed(params, None, batch, fixed.init(params), key=key, mask=None, context=at)
    b = adaptive(params, None, batch, adaptive.init(params), key=key, mask=None, context=ab)
    np.testing.assert_allclose(np.asarray(a.grads["w"]), np.asarray(b.grads["w"]), rtol=1e-6)
    normal = float(flat_normal(key, params, extra=1)[flat_size(params)])
    released = np.sum(np.where(norms <= np.float32(initial), 0.5, -0.5)) + 1.0 * normal
    fraction = min(1.0, max(0.0, released / 8 + 0.5))
    assert 0.0 < fraction < 1.0  # the normal moves the update (no clipping of the fraction)
    expected = initial * math.exp(-0.3 * (fraction - 0.4))
    assert float(b.state["clip"]["clip_norm"]) == pytest.approx(expected, rel=1e-5)
    other = float(flat_normal(key, params, extra=1)[flat_size(params) - 1])  # padding: unused
    wrong = initial * math.exp(
        -0.3 * (min(1.0, max(0.0, (released - normal + other) / 8 + 0.5)) - 0.4)
    )
    assert float(b.state["clip"]["clip_norm"]) != pytest.approx(wrong, rel=1e-5)


@pytest.mark.parametrize("n", [1, 5, 8, 67331])
def test_flat_draw_pads_without_changing_a_value(n):
    from jaxwise._shared._random import flat_draw

    key = jax.random.key(9)
    normal = flat_draw(lambda k, shape: jax.random.normal(k, shape), key, n)
    assert normal.shape == (n,)
    assert np.asarray(normal).tobytes() == np.asarray(jax.random.normal(key, (n,))).tobytes()
    coin = flat_draw(lambda k, shape: jax.random.bernoulli(k, 0.3, shape), key, n)
    assert np.array_equal(np.asarray(coin), np.asarray(jax.random.bernoulli(key, 0.3, (n,))))


def test_bandmf_resume_is_bit_identical_and_another_mechanism_is_refused(tmp_path):
    from jaxwise.checkpoint import CheckpointError, restore, save

    epoch, straight = _wired(BandMF(4, steps=16), AdaptiveClip(1.0), 4)
    for _ in range(2):
        straight, _ = epoch(straight, _wire_data())
    _, state = _wired(BandMF(4, steps=16), AdaptiveClip(1.0), 4)
    half, _ = epoch(state, _wire_data())
    save(tmp_path / "ck", half)
    _, like = _wired(BandMF(4, steps=16), AdaptiveClip(1.0), 4)
    resumed = restore(tmp_path / "ck", like=like)
    resumed, _ = epoch(resumed, _wire_data())
    assert _bits(resumed) == _bits(straight)  # params, buffers, index, clip norm, key
    _, other = _wired(BLT(2, steps=16), AdaptiveClip(1.0), 1)
    with pytest.raises(CheckpointError, match="gradient_state"):
        restore(tmp_path / "ck", like=other)
    _, fewer = _wired(BandMF(2, steps=16), AdaptiveClip(1.0), 2)  # other bands: other buffers
    with pytest.raises(CheckpointError, match=r"gradient_state\.noise\.buffers"):
        restore(tmp_path / "ck", like=fewer)
    _, fixed = _wired(BandMF(4, steps=16), 1.0, 4)  # the adaptive clip's state is missing
    with pytest.raises(CheckpointError, match="gradient_state"):
        restore(tmp_path / "ck", like=fixed)


# ---------------------------------------------------------------------------
# Mechanism × sampler pairing: refused when the epoch is made, read by the accountant
# ---------------------------------------------------------------------------


def _dp(noise: Any, clip: Any = 1.0) -> Any:
    return privacy.dp_gradient_fn(_wire_loss, clip_norm=clip, noise_multiplier=1.0, noise=noise)


@pytest.mark.parametrize(
    "noise, sampler",
    [
        (BandMF(4, steps=16), privacy.PoissonSampler(8)),
        (BandMF(4, steps=16), CyclicPoissonSampler(8, groups=3)),
        (BLT(2, steps=16, min_sep=4), CyclicPoissonSampler(8, groups=2)),
        (BandMF(2, steps=16), "shuffle"),
    ],
    ids=["bandmf-poisson", "bandmf-too-few-groups", "blt-too-few-groups", "bandmf-shuffle"],
)
def test_a_mismatched_mechanism_and_sampler_is_refused_at_construction(noise, sampler):
    from jaxwise import train

    if sampler == "shuffle":
        sampler = train.ShuffleSampler(8)
    with pytest.raises(privacy.PairingError, match=r"at most once every \d+ steps.*groups="):
        train.make_epoch(_dp(noise), sampler)
    with pytest.raises(ValueError):  # a PairingError is a ValueError
        _dp(noise).requirements.privacy.check_sampler(sampler.facts(None))


@pytest.mark.parametrize(
    "noise, sampler",
    [
        (None, privacy.PoissonSampler(8)),
        (None, CyclicPoissonSampler(8, groups=4)),
        (BandMF(1, steps=16), privacy.PoissonSampler(8)),
        (BandMF(4, steps=16), CyclicPoissonSampler(8, groups=4)),
        (BandMF(4, steps=16), CyclicPoissonSampler(8, groups=6)),
        (BLT(2, steps=16, min_sep=2), CyclicPoissonSampler(8, groups=2)),
    ],
)
def test_valid_pairings_are_accepted_and_accounted_from_the_objects(noise, sampler):
    from jaxwise import train

    epoch = train.make_epoch(_dp(noise), sampler)
    n, steps = 64, 16
    ours = privacy.epoch_epsilon(epoch, n, steps=steps, delta=1e-5)
    expected = privacy.epsilon(
        noise_multiplier=1.0,
        sample_rate=sampler.sample_rate(n),
        steps=steps,
        delta=1e-5,
        mechanism=noise,
    )
    assert ours == expected
    assert sampler.facts(None).min_separation >= (1 if noise is None else noise.min_separation)


def test_bandmf_accounting_reads_the_mechanisms_separation():
    # amplified BandMF: DP-SGD's Poisson event at the group's rate over ceil(T / bands) steps
    q, steps = 0.05, 30
    for bands in (1, 3, 7):
        mech = BandMF(bands, steps=steps)
        ours = privacy.epsilon(
            noise_multiplier=1.2, sample_rate=q, steps=steps, delta=1e-5, mechanism=mech
        )
        event = dp_accounting.SelfComposedDpEvent(
            dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(1.2)),
            math.ceil(steps / mech.min_separation),
        )
        acc = dp_accounting.rdp.RdpAccountant()
        acc.compose(event)
        assert ours == pytest.approx(acc.get_epsilon(1e-5), rel=1e-12)


def test_epoch_epsilon_counts_the_adaptive_clip_and_refuses_other_epochs():
    from jaxwise import train

    clip = AdaptiveClip(1.0, count_noise=2.0)
    sampler = CyclicPoissonSampler(8, groups=4)
    epoch = train.make_epoch(_dp(BandMF(4, steps=16), clip), sampler)
    ours = privacy.epoch_epsilon(epoch, 64, steps=16, delta=1e-5)
    expected = privacy.epsilon(
        noise_multiplier=1.0,
        sample_rate=sampler.sample_rate(64),
        steps=16,
        delta=1e-5,
        mechanism=BandMF(4, steps=16),
        clip=clip,
    )
    assert ours == expected
    plain = train.make_epoch(train.value_and_grad(lambda p, b: jnp.sum(p)), train.ShuffleSampler(8))
    with pytest.raises(TypeError, match="`epoch`"):
        privacy.epoch_epsilon(plain, 64, steps=16, delta=1e-5)
    with pytest.raises(TypeError, match="`epoch`"):
        privacy.epoch_epsilon("epoch", 64, steps=16, delta=1e-5)  # type: ignore[arg-type]


def test_a_skipped_step_still_counts_and_moves_the_noise_stream_on():
    # a poisoned row makes the steps that sample it non-finite: they are skipped, but the step
    # counter, the key and BandMF's buffers advance exactly as in the clean run (the noise
    # stream does not depend on the data), so no draw is reused and the cyclic groups of the
    # next epoch stay `groups` steps apart
    clean, poisoned = _wire_data(), _wire_data()
    poisoned = {**poisoned, "x": poisoned["x"].at[5].set(jnp.nan)}
    epoch, a = _wired(BandMF(4, steps=16), 1.0, 4)
    _, b = _wired(BandMF(4, steps=16), 1.0, 4)
    a, _ = epoch(a, clean)
    b, metrics = epoch(b, poisoned)
    skipped = int(np.asarray(metrics["skipped"]).sum())
    assert skipped >= 1  # row 5 is in group 1: sampled in some step with high probability
    assert int(a.step) == int(b.step) == epoch.steps_per_epoch(64)
    assert _bits(a.gradient_state) == _bits(b.gradient_state) and _bits(a.key) == _bits(b.key)
    assert np.isfinite(np.asarray(b.params["w"])).all()


def test_cyclic_epoch_divides_by_the_batch_of_one_group_not_the_dataset_rate():
    # A step samples one group: the expected batch is batch_size (sample_rate · n / groups),
    # not sample_rate · n (groups times larger, which silently divided BandMF's learning
    # rate by `groups`). Without noise and clipping, the update is the batch sum over B.
    from jaxwise import optim, train

    def linear(p, ex):
        return -jnp.dot(p["w"], ex["x"])  # every example's gradient is -x = -(1, 1, 1)

    n, batch, groups = 400, 20, 4
    sampler = privacy.CyclicPoissonSampler(batch, groups=groups)
    gradient = privacy.dp_gradient_fn(linear, clip_norm=100.0, noise_multiplier=0.0)
    assert sampler.facts(n).expected_batch_size == pytest.approx(batch)
    assert privacy.PoissonSampler(batch).facts(n).expected_batch_size == pytest.approx(batch)
    state = train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(1.0), 0, gradient=gradient)
    state, metrics = train.make_epoch(gradient, sampler)(state, {"x": jnp.ones((n, 3))})
    total = float(np.asarray(metrics["batch_size"]).sum())
    np.testing.assert_allclose(np.asarray(state.params["w"]), total / batch, rtol=1e-5)


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh-epoch", "epoch-already-run"])
@pytest.mark.parametrize("other", [None, BandMF(2, steps=16)], ids=["dpsgd-state", "bandmf2-state"])
def test_another_gradients_state_is_refused_by_name_on_every_call(fresh, other):
    # a DP-SGD (or 2-band) gradient_state handed to a 4-band BandMF epoch: the named error on
    # the first call and on a later one (it crashed inside _bandmf.py once the epoch had run)
    from jaxwise import optim, train

    epoch, state = _wired(BandMF(4, steps=16), groups=4)
    data = _wire_data()
    if not fresh:
        state, _ = epoch(state, data)
    gradient = privacy.dp_gradient_fn(_wire_loss, clip_norm=1.0, noise_multiplier=1.0, noise=other)
    foreign = train.TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0, gradient=gradient)
    with pytest.raises(ValueError, match="gradient_state.*(structure and shapes|is None)"):
        epoch(state.replace(gradient_state=foreign.gradient_state), data)
    state, _ = epoch(state, data)  # the right state still trains

"""Tests for one-run privacy auditing: the bound against the paper's algorithm and jax-privacy,
its validity (never above the ε of an honest run), and its power (a run without noise)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxwise import numerics, optim
from jaxwise.compilation import CompileBudget
from jaxwise.privacy import (
    Canaries,
    audit_canaries,
    empirical_epsilon,
    epsilon,
    make_dp_train_epoch,
)
from jaxwise.privacy._audit import _epsilon_bound, _p_value
from jaxwise.train import TrainState

# ---------------------------------------------------------------------------
# The bound: the paper's Appendix D, independently, and jax-privacy's implementation
# ---------------------------------------------------------------------------


def paper_p_value(m, r, v, eps, delta):
    """Steinke, Nasr & Jagielski (2023), Appendix D: the p-value, loop for loop."""
    q = 1 / (1 + math.exp(-eps))
    beta = stats.binom.sf(v - 1, r, q)
    alpha, total = 0.0, 0.0
    for i in range(1, v + 1):
        total += stats.binom.pmf(v - i, r, q)
        if total > i * alpha:
            alpha = total / i
    return min(beta + alpha * delta * 2 * m, 1)


def paper_eps(m, r, v, delta, p):
    """Appendix D's bisection for the largest ε whose p-value is below p."""
    lo, hi = 0.0, 1.0
    while paper_p_value(m, r, v, hi, delta) < p:
        hi += 1
    for _ in range(40):
        mid = (lo + hi) / 2
        if paper_p_value(m, r, v, mid, delta) < p:
            lo = mid
        else:
            hi = mid
    return lo


CASES = [  # (m canaries, r guesses, v correct, δ)
    (1000, 100, 100, 0.0),
    (1000, 100, 90, 1e-5),
    (1000, 500, 400, 1e-5),
    (5000, 200, 180, 1e-5),
    (100, 20, 19, 1e-3),
    (1000, 10, 10, 1e-5),
    (2000, 1000, 560, 1e-6),
]


@pytest.mark.parametrize("m, r, v, delta", CASES)
def test_bound_equals_the_papers_algorithm_and_jax_privacy(m, r, v, delta):
    jax_privacy = pytest.importorskip("jax_privacy.auditing")
    for eps in (0.0, 0.7, 2.5):
        ours = _p_value(m, r, v, eps, delta)
        assert ours == pytest.approx(paper_p_value(m, r, v, eps, delta), rel=1e-12, abs=1e-15)
        assert ours == pytest.approx(jax_privacy._one_run_p_value(m, r, v, eps, delta), rel=1e-12)
    bound = _epsilon_bound(m, r, v, delta, 0.95)
    assert bound == pytest.approx(paper_eps(m, r, v, delta, 0.05), abs=1e-6)
    assert bound == pytest.approx(jax_privacy._epsilon_one_run(0, m, r, v, 0.05, delta), abs=1e-5)


def test_all_correct_guesses_without_delta_have_a_closed_form():
    """δ = 0, v = r: the p-value is q^r, so ε = logit(p^(1/r))."""
    for r, confidence in [(10, 0.95), (100, 0.95), (1000, 0.99)]:
        q = (1 - confidence) ** (1 / r)
        assert _epsilon_bound(10 * r, r, r, 0.0, confidence) == pytest.approx(
            math.log(q / (1 - q)), rel=1e-12
        )


@pytest.mark.parametrize("eps", [1.0, 2.0, 4.0])
def test_idealised_randomised_response_is_bounded_tightly_and_validly(eps):
    """The paper's idealised setting: each guess is right with probability e^ε / (1 + e^ε).

    At 95% confidence the bound exceeds ε in at most 5% of runs (here: 400 runs, with three
    standard deviations of slack), and with many guesses it comes close to ε.
    """
    q = 1 / (1 + math.exp(-eps))
    draws = np.random.default_rng(0).binomial(200, q, size=400)
    above = sum(_epsilon_bound(200, 200, int(v), 0.0, 0.95) > eps for v in draws)
    assert above <= 0.05 * 400 + 3 * math.sqrt(400 * 0.05 * 0.95)
    correct = int(round(20_000 * q))  # the expected count of 20,000 guesses
    assert 0.9 * eps < _epsilon_bound(20_000, 20_000, correct, 0.0, 0.95) < eps


# ---------------------------------------------------------------------------
# Auditing DP-SGD runs: honest noise vs noise switched off
# ---------------------------------------------------------------------------


def linear_loss(w, example):
    x, y = example
    return -numerics.log_softmax(x @ w)[y]


def audited_run(sigma, seed, m=200, steps=40, batch_size=32):
    """DP-SGD of a softmax regression on blobs with ``m`` feature canaries: (bound, ε)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
    canaries = audit_canaries((x, y), m, seed=seed)
    data = tuple(jnp.asarray(a) for a in canaries.train_data((x, y)))
    tx = optim.sgd(2.0)
    epoch = make_dp_train_epoch(
        linear_loss, batch_size, clip_norm=1.0, noise_multiplier=sigma, method="vmap"
    )
    n = len(data[1])
    state = TrainState.create(jnp.zeros((4 + m, 3)), tx, jax.random.key(seed))
    for _ in range(-(-steps // epoch.steps_per_epoch(n))):
        state, _ = epoch(state, data)
    cx, cy = (jnp.asarray(a) for a in canaries.examples)
    scores = -np.asarray(jax.vmap(linear_loss, in_axes=(None, 0))(state.params, (cx, cy)))
    total = -(-steps // epoch.steps_per_epoch(n)) * epoch.steps_per_epoch(n)
    return canaries, scores, n, total


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_honest_noise_never_gives_a_bound_above_the_theoretical_epsilon():
    sigma = 2.0  # ε ≈ 1.6
    for seed in range(8):
        canaries, scores, n, steps = audited_run(sigma, seed)
        theory = epsilon(noise_multiplier=sigma, sample_rate=32 / n, steps=steps, delta=1e-5)
        bound = empirical_epsilon(scores, canaries.included, delta=1e-5)
        assert 0.0 <= bound <= theory, (seed, bound, theory)


def test_noise_switched_off_is_detected_far_above_the_claimed_epsilon():
    """A run that drops its noise (σ = 0) while claiming σ = 4: the audit refutes the claim."""
    canaries, scores, n, steps = audited_run(0.0, seed=3)
    claimed = epsilon(noise_multiplier=4.0, sample_rate=32 / n, steps=steps, delta=1e-5)
    bound = empirical_epsilon(scores, canaries.included, delta=1e-5)
    assert claimed < 1.0 and bound > 3.0 * claimed and bound > 2.5


def audited_bandmf_run(sigma, seed, bands=4, m=200, epochs=3, batch_size=32):
    """BandMF through make_epoch (cyclic Poisson, ``bands`` groups) with canaries: (bound, ε)."""
    from jaxwise import privacy, train

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(256, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0).astype(np.int32)
    canaries = audit_canaries((x, y), m, seed=seed)
    data = tuple(jnp.asarray(a) for a in canaries.train_data((x, y)))
    n = len(data[1])
    sampler = privacy.CyclicPoissonSampler(batch_size, groups=bands)
    steps = epochs * sampler.steps(n)
    mechanism = privacy.BandMF(bands, steps=steps)
    gradient = privacy.dp_gradient_fn(
        linear_loss, clip_norm=1.0, noise_multiplier=sigma, noise=mechanism, method="vmap"
    )
    state = TrainState.create(jnp.zeros((4 + m, 3)), optim.sgd(2.0), seed, gradient=gradient)
    epoch = train.make_epoch(gradient, sampler)
    for _ in range(epochs):
        state, _ = epoch(state, data)
    cx, cy = (jnp.asarray(a) for a in canaries.examples)
    scores = -np.asarray(jax.vmap(linear_loss, in_axes=(None, 0))(state.params, (cx, cy)))
    q = sampler.sample_rate(n)
    claimed = sigma or 4.0  # the noise-off run claims σ = 4
    theory = epsilon(
        noise_multiplier=claimed, sample_rate=q, steps=steps, delta=1e-5, mechanism=mechanism
    )
    return empirical_epsilon(scores, canaries.included, delta=1e-5), theory


@pytest.mark.slow
def test_bandmf_runs_audit_below_their_theoretical_epsilon_and_noise_off_is_caught():
    for seed in range(4):
        bound, theory = audited_bandmf_run(2.0, seed)
        assert 0.0 <= bound <= theory, (seed, bound, theory)
    bound, claimed = audited_bandmf_run(0.0, 3)
    assert bound > 2.0 * claimed, (bound, claimed)


# ---------------------------------------------------------------------------
# Canaries and the API
# ---------------------------------------------------------------------------


def test_feature_canaries_leave_the_model_on_real_inputs_unchanged():
    x = np.random.default_rng(0).normal(size=(40, 3)).astype(np.float32)
    y = np.arange(40) % 4
    canaries = audit_canaries((x, y), 10, seed=5)
    assert isinstance(canaries, Canaries) and canaries.kind == "feature"
    cx, cy = canaries.examples
    assert cx.shape == (10, 13) and cx.dtype == np.float32 and set(cy) <= {0, 1, 2, 3}
    np.testing.assert_array_equal(cx[:, :3], 0.0)
    np.testing.assert_allclose(cx[:, 3:], np.eye(10) * np.linalg.norm(x, axis=1).max(), rtol=1e-6)
    tx, ty = canaries.train_data((x, y))
    k = int(canaries.included.sum())
    assert tx.shape == (40 + k, 13) and ty.shape == (40 + k,)
    np.testing.assert_array_equal(tx[:40, :3], x)
    np.testing.assert_array_equal(tx[40:], cx[canaries.included])
    w = np.random.default_rng(1).normal(size=(13, 4))
    np.testing.assert_allclose(canaries.pad(x) @ w, x @ w[:3])  # canary rows never used
    again = audit_canaries((x, y), 10, seed=5)
    np.testing.assert_array_equal(again.included, canaries.included)
    far = audit_canaries((x.reshape(40, 3, 1), y), 10, seed=5, kind="far")
    assert far.examples[0].shape == (10, 3, 1) and far.pad(x).shape == x.shape
    norms = np.linalg.norm(far.examples[0].reshape(10, -1), axis=1)
    assert (norms >= 4 * np.linalg.norm(x, axis=1).max() * (1 - 1e-6)).all()


def test_empirical_epsilon_guesses_and_bonferroni():
    included = np.arange(400) % 2 == 0
    perfect = included.astype(np.float64)
    # a fixed number of guesses per side is the plain bound; the search pays for its grid
    assert empirical_epsilon(perfect, included, delta=0.0, guesses=100) == pytest.approx(
        _epsilon_bound(400, 200, 200, 0.0, 0.95)
    )
    searched = empirical_epsilon(perfect, included, delta=0.0)
    assert _epsilon_bound(400, 400, 400, 0.0, 0.95) > searched > 0
    assert empirical_epsilon(-perfect, included, delta=1e-5) == 0.0  # anti-correlated
    assert empirical_epsilon(np.zeros(400), included, delta=1e-5) == 0.0
    assert empirical_epsilon(perfect, included, delta=1e-5, confidence=0.5) > searched


def test_empirical_epsilon_ties_carry_no_evidence():
    # equal scores are not ranked by position: constant scores bound ε by 0 whatever the order
    first_half = np.arange(100) < 50
    for included in (first_half, ~first_half, np.arange(100) % 2 == 0):
        for delta in (0.0, 1e-5):
            assert empirical_epsilon(np.zeros(100), included, delta=delta) == 0.0
    # and a bound does not depend on the canaries' order (ties included)
    rng = np.random.default_rng(3)
    included = rng.random(300) < 0.5
    scores = np.round(included + rng.normal(size=300), 1)  # many ties
    assert len(np.unique(scores)) < 100
    bound = empirical_epsilon(scores, included, delta=0.0)
    assert bound > 0
    for seed in range(3):
        perm = np.random.default_rng(seed).permutation(300)
        shuffled = empirical_epsilon(scores[perm], included[perm], delta=0.0)
        assert shuffled == pytest.approx(bound, abs=0.3)  # ties fall differently, no more


def test_empirical_epsilon_refuses_an_audit_that_cannot_conclude():
    # pure DP (delta=0) is a legitimate claim to audit; too few canaries is not an audit
    perfect = np.arange(5) >= 2
    with pytest.raises(ValueError, match="5 canaries cannot give a bound .* at least 6 canaries"):
        empirical_epsilon(perfect.astype(float), perfect, delta=0.0)
    with pytest.raises(ValueError, match="at least 6 canaries"):
        empirical_epsilon(np.ones(2), np.asarray([True, False]), delta=1e-5)
    six = np.arange(6) >= 3
    assert empirical_epsilon(six.astype(float), six, delta=0.0) > 0  # the smallest audit
    included = np.arange(100) % 2 == 0
    with pytest.raises(ValueError, match="`guesses`=1: even 2 right guesses of 2"):
        empirical_epsilon(included.astype(float), included, delta=0.0, guesses=1)
    # the p-value the bound inverts, checked at the refusal's edge: 6 right of 6 at ε = 0
    assert _p_value(6, 6, 6, 0.0, 0.0) == pytest.approx(0.5**6)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda: empirical_epsilon(np.ones(4), np.ones(5, bool), delta=0.0), ValueError, "same"),
        (lambda: empirical_epsilon(np.ones(4), np.ones(4), delta=0.0), TypeError, "included"),
        (lambda: empirical_epsilon(np.ones(4), np.ones(4, bool), delta=1.0), ValueError, "delta"),
        (
            lambda: empirical_epsilon(np.ones(4), np.ones(4, bool), delta=0.0, confidence=1.0),
            ValueError,
            "confidence",
        ),
        (
            lambda: empirical_epsilon(np.ones(1), np.ones(1, bool), delta=0.0),
            ValueError,
            "at least",
        ),
        (
            lambda: empirical_epsilon(np.asarray([1.0, np.nan]), np.ones(2, bool), delta=0.0),
            ValueError,
            "finite",
        ),
        (
            lambda: empirical_epsilon(np.ones(4), np.ones(4, bool), delta=0.0, guesses=3),
            ValueError,
            "guesses",
        ),
        (lambda: audit_canaries(np.ones((4, 2)), 4), TypeError, r"\(x, y\)"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: audit_canaries((np.ones((4, 2)), np.ones(4)), 4), TypeError, "data\\[1\\]"),
        (lambda: audit_canaries((np.ones((4, 2)), np.ones(4, int)), 1), ValueError, "`m`"),
        (lambda: audit_canaries((np.ones((4, 2)), np.ones(3, int)), 4), ValueError, "length"),
        (
            lambda: audit_canaries((np.ones((4, 2)), np.ones(4, int)), 4, kind="x"),
            ValueError,
            "`kind`",
        ),
        (
            lambda: audit_canaries((np.ones((4, 2, 2)), np.ones(4, int)), 4),
            ValueError,
            "kind='far'",
        ),
    ],
)
def test_bad_input(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_the_audited_epoch_compiles_once():
    canaries = audit_canaries((np.ones((64, 2), np.float32), np.arange(64) % 2), 8, seed=0)
    data = tuple(jnp.asarray(a) for a in canaries.train_data((np.ones((64, 2)), np.arange(64) % 2)))
    tx = optim.sgd(0.1)
    epoch = make_dp_train_epoch(linear_loss, 16, clip_norm=1.0, noise_multiplier=1.0)
    state = TrainState.create(jnp.zeros((10, 2)), tx, 0)
    with CompileBudget(1, epoch, exact=True):
        for _ in range(3):
            state, _ = epoch(state, (data[0].astype(jnp.float32), data[1]))


# ---------------------------------------------------------------------------
# The command line: --dp --audit M
# ---------------------------------------------------------------------------


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_spiral_dp_audit_reports_theory_and_lower_bound(capsys):
    from jaxwise.cli import main
    from jaxwise.cli._jobs import SpiralConfig, run_spiral
    from jaxwise.cli._jobs._common import UserError

    cfg = SpiralConfig(
        epochs=2,
        n_per_class=40,
        batch_size=32,
        dp=True,
        audit=30,
        out=None,
        progress=False,
        cache=False,
    )
    summary = run_spiral(cfg)
    dp = summary["dp"]
    assert summary["ok"] and summary["compiles"] == 1
    assert dp["canaries"] == 30 and 0 < dp["canaries_included"] < 30
    assert 0.0 <= dp["epsilon_audit_lower_bound"] <= dp["epsilon"]
    assert dp["sample_rate"] == 32 / (96 + dp["canaries_included"])  # canaries are trained on
    assert summary["parameters"] == 2 * 64 + 64 + 64 * 64 + 64 + 64 * 3 + 3  # canary rows dropped
    with pytest.raises(UserError, match="--audit audits a DP-SGD run: it needs --dp"):
        run_spiral(SpiralConfig(epochs=1, audit=30, out=None, progress=False, cache=False))
    assert main(["spiral", "--audit", "5", "--dp", "--json", "--no-plots"]) == 2
    assert "--audit must be >= 6, got 5" in capsys.readouterr().err

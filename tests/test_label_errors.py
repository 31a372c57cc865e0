"""jaxwise.label_errors: out-of-fold probabilities in one program, one ranking score."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import label_errors as le
from jaxwise.compilation import CompileBudget, CompileCounter
from jaxwise.data import flip_labels, make_blobs, make_spiral
from jaxwise.label_errors._oof import mlp_init, padded_rows
from jaxwise.models import init_mlp, mlp_apply, mlp_loss


def _reference_flags(probs: np.ndarray, given: np.ndarray) -> np.ndarray:
    """Loop-by-loop float64 reference of cleanlab's confident joint: off-diagonal rows."""
    n, k = probs.shape
    thresholds = [np.mean([probs[i, j] for i in range(n) if given[i] == j]) for j in range(k)]
    flagged = np.zeros(n, bool)
    for i in range(n):
        above = [j for j in range(k) if probs[i, j] >= thresholds[j] - 1e-6]
        if above:
            guess = above[0] if len(above) == 1 else int(np.argmax(probs[i]))
            flagged[i] = guess != given[i]
    return flagged


def _reference_scores(probs: np.ndarray, given: np.ndarray, ranked_by: str) -> np.ndarray:
    """float64 loops: cleanlab's formulas for the three scores."""
    out = []
    k = probs.shape[1]
    for p, g in zip(probs, given):
        if ranked_by == "self_confidence":
            out.append(p[g])
        elif ranked_by == "normalized_margin":
            out.append((p[g] - max(p[j] for j in range(k) if j != g) + 1) / 2)
        else:
            entropy = -sum(q * np.log(max(q, 1e-10)) for q in p) / np.log(k)
            ratio = entropy / max(p[g], 1e-10)
            out.append(np.log(ratio + 1) / max(ratio, 1e-10))
    return np.asarray(out)


@pytest.mark.parametrize(
    "ranked_by", ["self_confidence", "normalized_margin", "confidence_weighted_entropy"]
)
def test_ranking_is_monotone_in_one_score(rng: np.random.Generator, ranked_by: str) -> None:
    logits = rng.normal(size=(300, 4)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    given = rng.integers(0, 4, 300)
    found = le.confident_learning(probs, given, ranked_by=ranked_by)  # pyright: ignore[reportArgumentType]
    reference = _reference_scores(probs, given, ranked_by)
    quality = le.label_quality(probs, given, ranked_by=ranked_by)  # pyright: ignore[reportArgumentType]
    np.testing.assert_allclose(quality, reference)
    np.testing.assert_allclose(found.score, reference[found.indices])
    # ONE ordering for the whole ranking: flagged rows are not moved ahead of the others
    assert np.all(np.diff(found.score) >= 0)
    assert sorted(found.indices.tolist()) == list(range(300))
    flagged = _reference_flags(probs, given)
    np.testing.assert_array_equal(found.flagged, flagged[found.indices])
    assert found.num_issues == flagged.sum() > 0
    head = found.indices[: found.num_issues]
    assert not np.all(flagged[head]) or ranked_by != "self_confidence"  # not a partition
    np.testing.assert_array_equal(found.p_given, probs[found.indices, given[found.indices]])
    assert found.ranked_by == ranked_by


def test_scores_and_estimate_match_cleanlab(rng: np.random.Generator) -> None:
    cleanlab = pytest.importorskip("cleanlab")
    from cleanlab.count import num_label_issues  # pyright: ignore[reportMissingImports]
    from cleanlab.rank import get_label_quality_scores  # pyright: ignore[reportMissingImports]

    del cleanlab
    logits = rng.normal(size=(400, 5)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    given = rng.integers(0, 5, 400)
    for ranked_by in ("self_confidence", "normalized_margin", "confidence_weighted_entropy"):
        ours = le.label_quality(probs, given, ranked_by=ranked_by)
        theirs = get_label_quality_scores(given, probs, method=ranked_by)
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    found = le.confident_learning(probs, given)
    assert found.num_issues == num_label_issues(given, probs, estimation_method="off_diagonal")


def test_self_confidence_ranks_a_low_p_given_row_above_a_flagged_one() -> None:
    """The issue's example: a flagged row with p(given) 0.48 no longer outranks 0.13."""
    probs = np.array(
        [
            [0.0, 0.48, 0.52],
            [0.45, 0.13, 0.42],
            [0.1, 0.4, 0.5],
            [0.95, 0.05, 0.0],
            [0.05, 0.9, 0.05],
        ]
    )
    given = np.array([1, 1, 2, 0, 1])
    found = le.confident_learning(probs, given)
    assert found.indices.tolist() == [1, 0, 2, 4, 3]  # by p(given) alone
    assert found.num_issues == 1 and found.flagged.tolist() == [False, True, False, False, False]
    assert found.top(found.num_issues).tolist() == [1]


def test_normalized_margin_and_suggested_label() -> None:
    probs = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.5, 0.45, 0.05]])
    given = np.array([1, 1, 2, 0])
    found = le.confident_learning(probs, given, ranked_by="normalized_margin")
    margin = {0: 0.3 - 0.6, 1: 0.5 - 0.3, 2: 0.8 - 0.1, 3: 0.5 - 0.45}
    for row, score, suggested in zip(found.indices, found.score, found.suggested):
        assert score == pytest.approx((margin[int(row)] + 1) / 2)
        assert suggested == int(np.argmax(np.where(np.arange(3) == given[row], -1, probs[row])))
    assert found.indices.tolist() == [0, 3, 1, 2] and found.flagged[0]


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"pred_probs": "p", "labels": np.zeros(2, int)}, TypeError, "pred_probs"),
        ({"pred_probs": np.ones((2, 2)) / 2, "labels": np.array([0, 2])}, ValueError, "labels"),
        ({"pred_probs": np.ones((2, 2)) / 2, "labels": np.array([0.0, 1.0])}, TypeError, "labels"),
        (
            {"pred_probs": np.ones((2, 2)) / 2, "labels": np.array([0, 1]), "ranked_by": "loss"},
            ValueError,
            "ranked_by",
        ),
        (
            {"pred_probs": np.array([[np.nan, 1.0], [0.5, 0.5]]), "labels": np.array([0, 1])},
            ValueError,
            "pred_probs",
        ),
        ({"pred_probs": np.ones((3, 2)) / 2, "labels": np.array([0, 1])}, ValueError, "rows"),
    ],
)
def test_confident_learning_bad_input(kwargs: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        le.confident_learning(**kwargs)
    with pytest.raises(error, match=names):
        le.label_quality(**kwargs)


def test_out_of_fold_is_one_program_and_reused() -> None:
    x, y = make_blobs(120, n_features=2, n_classes=3, seed=0)
    init = mlp_init((2, 8, 3))
    with CompileCounter() as first:
        le.out_of_fold_probabilities(mlp_apply, init, x, y, folds=4, epochs=3, batch_size=32)
    assert first.count == 1  # init, training, validation and prediction: one program
    with CompileCounter() as again:
        out = le.out_of_fold_probabilities(
            mlp_apply,
            init,
            x[::-1].copy(),
            y[::-1].copy(),
            folds=4,
            epochs=3,
            batch_size=32,
            seed=1,
        )
    assert again.count == 0
    np.testing.assert_allclose(out.probs.sum(1), 1.0, rtol=1e-6)
    assert out.probs.shape == (120, 3) and out.val_loss.shape == (3, 4)
    assert jax.tree.leaves(out.params)[0].shape[0] == 4


def test_no_recompilation_for_a_nearby_size() -> None:
    assert padded_rows(300) == padded_rows(310)
    x, y = make_blobs(310, n_features=3, n_classes=3, seed=0)
    le.find_label_errors(x[:300], y[:300], training=le.Training(epochs=2), seed=0)
    with CompileBudget(0, exact=True):
        found = le.find_label_errors(x, y, training=le.Training(epochs=2), seed=5)
    assert found.pred_probs.shape == (310, 3) and len(found.indices) == 310


def test_standardisation_uses_training_fold_statistics_only() -> None:
    """A held-out row's probabilities ignore another held-out row scaled by 1000."""
    x, y = make_blobs(100, n_features=3, n_classes=2, seed=3)
    fold_of = le.stratified_folds(y, 5, seed=0)
    args: dict[str, Any] = dict(
        folds=5, epochs=4, batch_size=16, patience=None, fold_of=fold_of, seed=0
    )
    init = mlp_init((3, 8, 2))
    base = le.out_of_fold_probabilities(mlp_apply, init, x, y, **args)
    same_fold = np.flatnonzero(fold_of == fold_of[7])
    scaled = x.copy()
    scaled[same_fold[1]] *= 1000.0
    other = le.out_of_fold_probabilities(mlp_apply, init, scaled, y, **args)
    keep = same_fold[same_fold != same_fold[1]]
    np.testing.assert_array_equal(base.probs[keep], other.probs[keep])
    # the scaled row trains the other folds' models (and their statistics): they change
    assert not np.allclose(base.probs[fold_of != fold_of[7]], other.probs[fold_of != fold_of[7]])


def test_standardize_false_sees_the_raw_features() -> None:
    """Raw features of very different units: standardisation is what makes them usable."""
    x, y = make_blobs(300, n_features=4, n_classes=3, seed=2)
    noisy, flipped = flip_labels(y, 30, 3, seed=0)
    # informative columns in thousandths, two noise columns in thousands, all offset by 100
    noise = np.random.default_rng(0).normal(0, 1e3, (300, 2)).astype(np.float32)
    scaled = np.concatenate([x * np.float32(1e-3), noise], axis=1) + np.float32(100)
    found = le.find_label_errors(scaled, noisy, seed=0)
    raw = le.find_label_errors(scaled, noisy, model=le.MLP(standardize=False), seed=0)
    precision = le.precision_recall(found.indices, flipped, 30)[0]
    assert precision >= 0.9 and le.precision_recall(raw.indices, flipped, 30)[0] <= 0.5
    pre = (scaled - scaled.mean(0)) / scaled.std(0)
    again = le.find_label_errors(pre, noisy, model=le.MLP(standardize=False), seed=0)
    assert le.precision_recall(again.indices, flipped, 30)[0] >= precision - 0.05


def test_fold_isolation_without_early_stopping() -> None:
    """A row's out-of-fold probabilities do not depend on its own label."""
    x, y = make_blobs(100, n_features=2, n_classes=2, seed=3)
    fold_of = le.stratified_folds(y, 5, seed=0)
    args: dict[str, Any] = dict(
        folds=5, epochs=4, batch_size=20, patience=None, fold_of=fold_of, seed=0
    )
    init = {"dense_0": {"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}}
    base = le.out_of_fold_probabilities(mlp_apply, init, x, y, **args)
    changed = y.copy()
    changed[7] = 1 - changed[7]
    other = le.out_of_fold_probabilities(mlp_apply, init, x, changed, **args)
    np.testing.assert_array_equal(base.probs[7], other.probs[7])
    same_fold = np.flatnonzero(fold_of == fold_of[7])
    np.testing.assert_array_equal(base.probs[same_fold], other.probs[same_fold])
    assert not np.array_equal(base.probs[fold_of != fold_of[7]], other.probs[fold_of != fold_of[7]])


def test_held_out_labels_never_influence_their_fold_model_with_early_stopping() -> None:
    """Default early stopping: a fold's probabilities ignore every label it judges (bitwise)."""
    x, y = make_blobs(150, n_features=2, n_classes=3, seed=1)
    noisy, _ = flip_labels(y, 30, 3, seed=0)
    fold_of = le.stratified_folds(noisy, 5, seed=0)
    args: dict[str, Any] = dict(folds=5, epochs=30, batch_size=16, fold_of=fold_of, seed=0)
    init = mlp_init((2, 16, 3))
    base = le.out_of_fold_probabilities(mlp_apply, init, x, noisy, **args)  # patience=10
    assert np.any(base.best_epoch < 20)  # early stopping did choose an epoch
    held = fold_of == 2
    changed = noisy.copy()
    changed[held] = (changed[held] + 1) % 3  # every label fold 2 judges, and nothing else
    other = le.out_of_fold_probabilities(mlp_apply, init, x, changed, **args)
    np.testing.assert_array_equal(base.probs[held], other.probs[held])
    assert base.best_epoch[2] == other.best_epoch[2]
    np.testing.assert_array_equal(base.val_loss[:, 2], other.val_loss[:, 2])
    # the other folds trained (or validated) on the changed labels: they do change
    assert not np.array_equal(base.probs[~held], other.probs[~held])
    # each fold watched one in 6 of its own training rows, never a row it judges
    for fold in range(5):
        train = int(np.sum(fold_of != fold))
        assert not np.any(base.validation[fold] & (fold_of == fold))
        assert base.validation[fold].sum() == -(-train // 6)
        # stratified by the training labels: every class is represented
        assert set(noisy[base.validation[fold]].tolist()) == {0, 1, 2}


def test_inner_validation_rows_are_not_trained_on() -> None:
    """Early stopping costs one training row in 6: ``batch_size`` must fit in the rest."""
    x, y = make_blobs(40, n_features=2, n_classes=2, seed=0)
    with pytest.raises(ValueError, match=r"`Training.batch_size` 30 .*26 rows.*early stopping"):
        le.find_label_errors(x, y, training=le.Training(epochs=1, batch_size=30))
    # without early stopping all 32 are trained on
    le.find_label_errors(x, y, training=le.Training(epochs=1, batch_size=30, patience=None))


def test_early_stopping_keeps_the_best_epoch() -> None:
    x, y = make_blobs(150, n_features=2, n_classes=3, seed=1)
    noisy, _ = flip_labels(y, 30, 3, seed=0)
    init = mlp_init((2, 32, 3))
    out = le.out_of_fold_probabilities(
        mlp_apply, init, x, noisy, folds=3, epochs=25, batch_size=16, patience=25
    )
    np.testing.assert_array_equal(out.best_epoch, np.nanargmin(out.val_loss, axis=0) + 1)
    short = le.out_of_fold_probabilities(
        mlp_apply, init, x, noisy, folds=3, epochs=25, batch_size=16, patience=2
    )
    for fold in range(3):  # stopped: no later epoch improved on the kept one by patience's end
        best = short.best_epoch[fold]
        assert best >= 1
        assert np.all(short.val_loss[best - 1, fold] <= short.val_loss[:best, fold] + 1e-7)
        # the fold stopped `patience` epochs after its best one: no later epoch was computed
        assert np.all(np.isfinite(short.val_loss[: best + 2, fold]))
        assert np.all(np.isnan(short.val_loss[best + 2 :, fold]))


@pytest.mark.parametrize(
    ("dataset", "min_precision", "min_recall"),
    [("blobs", 0.9, 0.95), ("overlapping blobs", 0.55, 0.7), ("spiral", 0.8, 0.9)],
)
def test_finds_flipped_labels(dataset: str, min_precision: float, min_recall: float) -> None:
    if dataset == "blobs":
        x, y = make_blobs(400, n_features=5, n_classes=4, seed=0)
    elif dataset == "overlapping blobs":  # a linear model fits only 79 % of the clean labels
        x, y = make_blobs(400, n_features=5, n_classes=4, separation=1.0, seed=0)
    else:
        x, y = make_spiral(100, n_classes=3, noise=0.1, seed=0)
    k = int(y.max()) + 1
    noisy, flipped = flip_labels(y, len(y) // 10, k, seed=1)
    found = le.find_label_errors(x, noisy, model=le.MLP(hidden=(64, 64)), seed=0)
    precision, recall = le.precision_recall(found.indices, flipped, len(flipped))
    assert precision >= min_precision and recall >= min_recall
    # the suggested label of a flipped row found in the top K is mostly its true label
    top = found.indices[: len(flipped)]
    hits = np.isin(top, flipped)
    assert np.mean(found.suggested[: len(flipped)][hits] == y[top[hits]]) >= min_precision
    assert 0.5 * len(flipped) <= found.num_issues <= 2 * len(flipped)


def test_custom_model_through_apply_fn() -> None:
    x, y = make_blobs(200, n_features=2, n_classes=3, seed=2)
    noisy, flipped = flip_labels(y, 20, 3, seed=0)

    def linear(params: dict, xb: jax.Array) -> jax.Array:
        return xb @ params["w"] + params["b"]

    init = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
    found = le.find_label_errors(
        x,
        noisy,
        model=le.Classifier(linear, init=init),
        folds=le.Folds(n_repeats=1),
        training=le.Training(epochs=40),
    )
    assert le.precision_recall(found.indices, flipped, 20)[0] >= 0.7
    assert len(found.oof) == 1 and found.pred_probs.shape == (200, 3)


GRADNORM = le.Scoring(method="gradnorm")
ONE_EPOCH = le.Training(epochs=1)
W = {"w": jnp.ones(2)}


@pytest.mark.parametrize(
    ("options", "error", "name"),
    [
        (lambda: {"x": "data"}, TypeError, "x"),
        (lambda: {"y": np.zeros(10)}, TypeError, "y"),
        (lambda: {"folds": le.Folds(1)}, ValueError, "Folds.n_splits"),
        (lambda: {"folds": le.Folds(n_repeats=0)}, ValueError, "Folds.n_repeats"),
        (lambda: {"training": le.Training(epochs=True)}, TypeError, "Training.epochs"),
        (lambda: {"scoring": le.Scoring(ranked_by="grad")}, ValueError, "Scoring.ranked_by"),  # pyright: ignore[reportArgumentType]
        (lambda: {"num_classes": 1}, ValueError, "num_classes"),
        (lambda: {"model": le.Classifier(mlp_apply)}, TypeError, "init"),
        (lambda: {"training": le.Training(1, batch_size=0)}, ValueError, "batch_size"),
        (lambda: {"scoring": le.Scoring(method="loss")}, ValueError, "Scoring.method"),  # pyright: ignore[reportArgumentType]
        (lambda: {"model": le.MLP(params=W)}, TypeError, "params"),
        (lambda: {"scoring": GRADNORM}, TypeError, "params"),
        (
            lambda: {"scoring": GRADNORM, "model": le.Classifier(mlp_apply, init=W)},
            TypeError,
            "init",
        ),
        (
            lambda: {"scoring": GRADNORM, "model": le.MLP(params={"w": jnp.ones(2, jnp.int32)})},
            TypeError,
            "params",
        ),
        (
            lambda: {
                "scoring": GRADNORM,
                "model": le.MLP(params=init_mlp(0, (2, 3))),
                "num_classes": 2,
            },
            ValueError,
            "3",
        ),
        (lambda: {"y": np.zeros(7, np.int32)}, ValueError, "rows"),
        (lambda: {"model": le.MLP(standardize="yes")}, TypeError, "MLP.standardize"),  # pyright: ignore[reportArgumentType]
        (lambda: {"training": le.Training(1, batch_size=33)}, ValueError, "batch_size"),
        (lambda: {"training": le.Training(1, patience=0)}, ValueError, "Training.patience"),
        (lambda: {"x": np.full((40, 2), np.inf)}, ValueError, "finite"),
        (lambda: {"seed": -1}, ValueError, "seed"),
    ],
)
def test_find_label_errors_bad_input(options: Callable[[], dict], error: type, name: str) -> None:
    x, y = make_blobs(40, n_features=2, n_classes=2, seed=0)
    with pytest.raises(error, match=name):
        call = {"x": x, "y": y, "training": ONE_EPOCH, **options()}
        le.find_label_errors(call.pop("x"), call.pop("y"), **call)


def _trained_linear_softmax(x: np.ndarray, y: np.ndarray) -> dict:
    """Multinomial logistic regression (a one-layer jaxwise MLP), trained on every row."""
    from jaxwise import optim

    params = init_mlp(jax.random.key(0), (x.shape[1], int(y.max()) + 1))
    tx = optim.adam(1e-2)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    loss = mlp_loss(lambda z, t: -jax.nn.log_softmax(z)[t])

    @jax.jit
    def step(p: dict, s: Any) -> tuple:
        g = jax.grad(lambda q: jnp.mean(jax.vmap(loss, in_axes=(None, 0))(q, (xj, yj))))(p)
        u, s = tx.update(g, s, p)
        return optim.apply_updates(p, u), s

    state = tx.init(params)
    for _ in range(150):
        params, state = step(params, state)
    return params


def test_gradnorm_ranks_by_a_trained_models_gradient_norm() -> None:
    x, y = make_blobs(1000, 20, 10, seed=0)
    noisy, flipped = flip_labels(y, 20, 10, seed=1)
    params = _trained_linear_softmax(x, noisy)
    found = le.find_label_errors(
        x, noisy, model=le.MLP(params=params), scoring=le.Scoring(method="gradnorm")
    )
    recall = len(set(found.indices[:40].tolist()) & set(flipped.tolist())) / len(flipped)
    assert recall >= 0.9, recall
    # float64 referee: for softmax(x W + b), ‖∇_i‖² = (‖x_i‖² + 1) ‖p_i − onehot(y_i)‖²
    w = np.asarray(params["dense_0"]["w"], np.float64)
    b = np.asarray(params["dense_0"]["b"], np.float64)
    z = x.astype(np.float64) @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    residual = p - np.eye(10)[noisy]
    norms64 = np.sqrt((np.sum(x.astype(np.float64) ** 2, 1) + 1) * np.sum(residual**2, 1))
    np.testing.assert_allclose(-found.score, norms64[found.indices], rtol=1e-4, atol=1e-4)
    assert np.all(np.diff(-found.score) <= 0) and not found.flagged.any() and found.num_issues == 0
    np.testing.assert_allclose(found.pred_probs, p, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(found.p_given, p[found.indices, noisy[found.indices]], atol=1e-6)
    idx, norms = le.hardest_examples(
        mlp_loss(lambda zz, t: -jax.nn.log_softmax(zz)[t]),
        params,
        (jnp.asarray(x), jnp.asarray(noisy)),
        k=5,
        method="ghost",
    )
    np.testing.assert_array_equal(np.asarray(idx), found.indices[:5])
    np.testing.assert_allclose(np.asarray(norms), norms64[found.indices[:5]], rtol=1e-4)


def test_hardest_examples_takes_a_dict_batch_and_checks_k() -> None:
    w = jnp.asarray([1.0, -2.0])
    x = jnp.asarray([[1.0, 0.0], [0.0, 3.0], [2.0, 2.0], [0.5, 0.5]])
    y = jnp.asarray([1.0, 0.0, 0.0, 0.0])
    tuple_idx, tuple_norms = le.hardest_examples(
        lambda p, e: (e[0] @ p - e[1]) ** 2, w, (x, y), k=3
    )
    dict_idx, dict_norms = le.hardest_examples(
        lambda p, e: (e["x"] @ p - e["y"]) ** 2, w, {"x": x, "y": y}, k=3
    )
    x64, y64, w64 = (np.asarray(a, np.float64) for a in (x, y, w))
    norms64 = np.abs(2 * (x64 @ w64 - y64)) * np.linalg.norm(x64, axis=1)
    np.testing.assert_array_equal(np.asarray(tuple_idx), np.argsort(-norms64)[:3])
    np.testing.assert_array_equal(np.asarray(dict_idx), np.asarray(tuple_idx))
    np.testing.assert_allclose(np.asarray(dict_norms), np.sort(norms64)[::-1][:3], rtol=1e-6)
    np.testing.assert_array_equal(np.asarray(dict_norms), np.asarray(tuple_norms))
    for k, error in ((0, ValueError), (5, ValueError), (2.5, TypeError), (True, TypeError)):
        with pytest.raises(error, match="`k`"):
            le.hardest_examples(lambda p, e: (e[0] @ p - e[1]) ** 2, w, (x, y), k=k)  # pyright: ignore[reportArgumentType]  # bad input on purpose (2.5 and True)


@pytest.mark.slow
def test_a_second_process_loads_the_program_from_the_persistent_cache(tmp_path) -> None:
    """The documented recipe: JAX's persistent compilation cache serves a fresh process."""
    import subprocess
    import sys

    script = tmp_path / "find.py"
    script.write_text(
        "import sys, jax\n"
        "jax.config.update('jax_compilation_cache_dir', sys.argv[1])\n"
        "jax.config.update('jax_persistent_cache_min_compile_time_secs', 0)\n"
        "hits = []\n"
        "jax.monitoring.register_event_listener(\n"
        "    lambda event, **_: hits.append(event) if 'cache_hits' in event else None)\n"
        "from jaxwise.data import make_blobs\n"
        "from jaxwise.label_errors import Training, find_label_errors\n"
        "x, y = make_blobs(200, n_classes=3, seed=0)\n"
        "find_label_errors(x, y, training=Training(epochs=2))\n"
        "print(len(hits))\n"
    )
    runs = [
        subprocess.run(
            [sys.executable, str(script), str(tmp_path / "cache")],
            capture_output=True,
            text=True,
            check=True,
        )
        for _ in range(2)
    ]
    assert int(runs[0].stdout.split()[-1]) == 0
    assert int(runs[1].stdout.split()[-1]) >= 1  # the out-of-fold program, loaded

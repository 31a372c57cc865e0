"""jaxwise.label_errors: out-of-fold probabilities in one program, confident learning."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import label_errors as le
from jaxwise.compilation import CompileCounter
from jaxwise.data import flip_labels, make_blobs, make_spiral
from jaxwise.models import init_mlp, mlp_apply, mlp_loss


def mlp_init(sizes: tuple[int, ...]) -> functools.partial:
    """``init(key)`` of an MLP: one stable object, so reruns reuse the program."""
    return functools.partial(init_mlp, sizes=sizes)


def _reference_confident_learning(
    probs: np.ndarray, given: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Loop-by-loop float64 reference: thresholds and off-diagonal confident-joint members."""
    n, k = probs.shape
    thresholds = np.zeros(k)
    for j in range(k):
        rows = [i for i in range(n) if given[i] == j]
        thresholds[j] = sum(probs[i, j] for i in rows) / len(rows)
    candidate = np.zeros(n, bool)
    for i in range(n):
        above = [j for j in range(k) if probs[i, j] >= thresholds[j]]
        if above:
            best = max(above, key=lambda j: probs[i, j])
            candidate[i] = best != given[i]
    return thresholds, candidate


def test_confident_learning_matches_loop_reference(rng: np.random.Generator) -> None:
    logits = rng.normal(size=(200, 4)) * 2
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    given = rng.integers(0, 4, 200)
    found = le.confident_learning(probs, given)
    _, candidate = _reference_confident_learning(probs, given)
    assert found.num_candidates == candidate.sum()
    assert set(found.indices[: found.num_candidates].tolist()) == set(
        np.flatnonzero(candidate).tolist()
    )
    # candidates first, each group by ascending p(given)
    p_given = probs[np.arange(200), given]
    head, tail = found.indices[: found.num_candidates], found.indices[found.num_candidates :]
    assert np.all(np.diff(p_given[head]) >= 0) and np.all(np.diff(p_given[tail]) >= 0)
    np.testing.assert_array_equal(found.p_given, p_given[found.indices])
    assert sorted(found.indices.tolist()) == list(range(200))


def test_normalized_margin_and_suggested_label() -> None:
    probs = np.array([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.5, 0.45, 0.05]])
    given = np.array([1, 1, 2, 0])
    found = le.confident_learning(probs, given, ranked_by="normalized_margin")
    margin = {0: 0.3 - 0.6, 1: 0.5 - 0.3, 2: 0.8 - 0.1, 3: 0.5 - 0.45}
    for row, score, suggested in zip(found.indices, found.score, found.suggested):
        assert score == pytest.approx(margin[int(row)])
        assert suggested == int(np.argmax(np.where(np.arange(3) == given[row], -1, probs[row])))
    assert found.indices[0] == 0 and found.candidate[0]


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
    ],
)
def test_confident_learning_bad_input(kwargs: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        le.confident_learning(**kwargs)


def test_out_of_fold_is_one_program_and_reused() -> None:
    x, y = make_blobs(120, n_features=2, n_classes=3, seed=0)
    init = mlp_init((2, 8, 3))
    with CompileCounter("_train_folds") as first:
        le.out_of_fold_probabilities(mlp_apply, init, x, y, folds=4, epochs=3, batch_size=32)
    assert first.count == 1
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


def test_fold_isolation_without_early_stopping() -> None:
    """A row's out-of-fold probabilities do not depend on its own label."""
    x, y = make_blobs(100, n_features=2, n_classes=2, seed=3)
    fold_of = le.stratified_folds(y, 5, seed=0)
    args = dict(folds=5, epochs=4, batch_size=20, patience=None, fold_of=fold_of, seed=0)
    init = {"dense_0": {"w": jnp.zeros((2, 2)), "b": jnp.zeros(2)}}
    base = le.out_of_fold_probabilities(mlp_apply, init, x, y, **args)
    changed = y.copy()
    changed[7] = 1 - changed[7]
    other = le.out_of_fold_probabilities(mlp_apply, init, x, changed, **args)
    np.testing.assert_array_equal(base.probs[7], other.probs[7])
    same_fold = np.flatnonzero(fold_of == fold_of[7])
    np.testing.assert_array_equal(base.probs[same_fold], other.probs[same_fold])
    assert not np.array_equal(base.probs[fold_of != fold_of[7]], other.probs[fold_of != fold_of[7]])


def test_early_stopping_keeps_the_best_epoch() -> None:
    x, y = make_blobs(150, n_features=2, n_classes=3, seed=1)
    noisy, _ = flip_labels(y, 30, 3, seed=0)
    out = le.out_of_fold_probabilities(
        mlp_apply, mlp_init((2, 32, 3)), x, noisy, folds=3, epochs=25, batch_size=16, patience=25
    )
    np.testing.assert_array_equal(out.best_epoch, np.nanargmin(out.val_loss, axis=0) + 1)
    short = le.out_of_fold_probabilities(
        mlp_apply, mlp_init((2, 32, 3)), x, noisy, folds=3, epochs=25, batch_size=16, patience=2
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
    found = le.find_label_errors(x, noisy, hidden=(64, 64), epochs=60, seed=0)
    precision, recall = le.precision_recall(found.indices, flipped, len(flipped))
    assert precision >= min_precision and recall >= min_recall
    # the suggested label of a flipped row found in the top K is mostly its true label
    top = found.indices[: len(flipped)]
    hits = np.isin(top, flipped)
    assert np.mean(found.suggested[: len(flipped)][hits] == y[top[hits]]) >= min_precision


def test_custom_model_through_apply_fn() -> None:
    x, y = make_blobs(200, n_features=2, n_classes=3, seed=2)
    noisy, flipped = flip_labels(y, 20, 3, seed=0)

    def linear(params: dict, xb: jax.Array) -> jax.Array:
        return xb @ params["w"] + params["b"]

    init = {"w": jnp.zeros((2, 3)), "b": jnp.zeros(3)}
    found = le.find_label_errors(x, noisy, apply_fn=linear, init=init, epochs=40, repeats=1)
    assert le.precision_recall(found.indices, flipped, 20)[0] >= 0.7
    assert len(found.oof) == 1 and found.pred_probs.shape == (200, 3)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"x": "data"}, TypeError, "x"),
        ({"y": np.zeros(10)}, TypeError, "y"),
        ({"folds": 1}, ValueError, "folds"),
        ({"repeats": 0}, ValueError, "repeats"),
        ({"epochs": True}, TypeError, "epochs"),
        ({"ranked_by": "grad"}, ValueError, "ranked_by"),
        ({"num_classes": 1}, ValueError, "num_classes"),
        ({"apply_fn": mlp_apply}, TypeError, "init"),
        ({"batch_size": 0}, ValueError, "batch_size"),
        ({"method": "loss"}, ValueError, "method"),
        ({"params": {"w": jnp.ones(2)}}, TypeError, "params"),
        ({"method": "gradnorm"}, TypeError, "params"),
        ({"method": "gradnorm", "init": {"w": jnp.ones(2)}}, TypeError, "init"),
        ({"method": "gradnorm", "params": {"w": jnp.ones(2, jnp.int32)}}, TypeError, "params"),
        ({"method": "gradnorm", "params": init_mlp(0, (2, 3)), "num_classes": 2}, ValueError, "3"),
        ({"y": np.zeros(7, np.int32)}, ValueError, "rows"),
    ],
)
def test_find_label_errors_bad_input(kwargs: dict, error: type, name: str) -> None:
    x, y = make_blobs(40, n_features=2, n_classes=2, seed=0)
    call = {"x": x, "y": y, "epochs": 1, **kwargs}
    with pytest.raises(error, match=name):
        le.find_label_errors(call.pop("x"), call.pop("y"), **call)


def _trained_linear_softmax(x: np.ndarray, y: np.ndarray) -> dict:
    """Multinomial logistic regression (a one-layer jaxwise MLP), trained on every row."""
    from jaxwise import optim

    params = init_mlp(jax.random.key(0), (x.shape[1], int(y.max()) + 1))
    tx = optim.adam(1e-2)
    xj, yj = jnp.asarray(x), jnp.asarray(y)
    loss = mlp_loss(lambda z, t: -jax.nn.log_softmax(z)[t])

    @jax.jit
    def step(p: dict, s: object) -> tuple:
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
    found = le.find_label_errors(x, noisy, method="gradnorm", params=params)
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
    assert np.all(np.diff(-found.score) <= 0) and not found.candidate.any()
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
            le.hardest_examples(lambda p, e: (e[0] @ p - e[1]) ** 2, w, (x, y), k=k)

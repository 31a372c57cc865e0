"""``find_label_errors``' grouped options: their checks, and the same results as the 17 keywords.

``tests/data/label_errors_golden-jax<version>.npz`` holds what ``find_label_errors`` returned
at commit 404afb0 under that JAX (``tests/goldens.py``), before its options were grouped (written by
``tests/data/make_label_errors_golden.py``): the default call, a call that set every old
keyword to a non-default value, and a ``method="gradnorm"`` call. On the machine and JAX
version that wrote it the new calls agree bit for bit; another CPU or JAX release may compile
the same programs with other vector code and move the last float32 bits (JAX 0.10.2 moves
them by at most 3e-7 here), so the floats are compared to a few float32 ulps and every
integer and boolean (the ranking, the suggested classes, the flags, each fold's best epoch)
exactly. A changed default (a width, a patience, a fold count, the optimizer) moves far more.
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import goldens
import jax
import numpy as np
import optax
import pytest
from host64 import host_default

from jaxwise import label_errors as le
from jaxwise.models import mlp_apply

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import make_label_errors_golden as golden  # noqa: E402  # pyright: ignore[reportMissingImports]

GOLDEN, _ = goldens.load("label_errors")
W = {"w": np.ones((2, 3), np.float32)}


# ---------------------------------------------------------------------------
# the option objects refuse bad fields, naming them
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: le.MLP(hidden=4), TypeError, r"`MLP.hidden` must be a sequence"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.MLP(hidden="64"), TypeError, r"`MLP.hidden` must be a sequence"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.MLP(hidden=(64, 0)), ValueError, r"`MLP.hidden` must be >= 1, got 0"),
        (lambda: le.MLP(hidden=(6.5,)), TypeError, r"`MLP.hidden` must be an int"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.MLP(standardize=1), TypeError, r"`MLP.standardize` must be a bool"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.MLP(params={"w": np.ones(2, np.int32)}), TypeError, r"`MLP.params` leaf `w`"),
        (lambda: le.MLP(params={}), ValueError, r"`MLP.params` has no array leaves"),
        (lambda: le.Classifier("f", init=W), TypeError, r"`Classifier.apply_fn` must be callable"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.Classifier(mlp_apply), TypeError, r"`Classifier` needs `init` .* `params`"),
        (lambda: le.Classifier(mlp_apply, init=W, params=W), TypeError, r"not both"),
        (lambda: le.Classifier(mlp_apply, init=[1]), TypeError, r"`Classifier.init` .*float"),
        (lambda: le.Classifier(mlp_apply, params=3), TypeError, r"`Classifier.params`"),
        (
            lambda: le.Classifier(mlp_apply, init=W, standardize="no"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
            TypeError,
            r"`Classifier.standardize` must be a bool",
        ),
        (lambda: le.Folds(1), ValueError, r"`Folds.n_splits` must be >= 2, got 1"),
        (lambda: le.Folds(5.0), TypeError, r"`Folds.n_splits` must be an int"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.Folds(n_repeats=0), ValueError, r"`Folds.n_repeats` must be >= 1"),
        (lambda: le.Folds(n_repeats="2"), TypeError, r"`Folds.n_repeats` must be an int"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.Training(epochs=0), ValueError, r"`Training.epochs` must be >= 1"),
        (lambda: le.Training(epochs=True), TypeError, r"`Training.epochs` must be an int"),
        (lambda: le.Training(batch_size=-4), ValueError, r"`Training.batch_size` must be >= 1"),
        (lambda: le.Training(patience=0), ValueError, r"`Training.patience` must be >= 1"),
        (lambda: le.Training(patience=2.5), TypeError, r"`Training.patience` must be an int"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (
            lambda: le.Training(optimizer="adam"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
            TypeError,
            r"`Training.optimizer` must be an Optax GradientTransformation .* got str",
        ),
        (lambda: le.Scoring(method="cleanlab"), ValueError, r"`Scoring.method` must be one of"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.Scoring(ranked_by="loss"), ValueError, r"`Scoring.ranked_by` must be one of"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        (lambda: le.Scoring(ranked_by=None), ValueError, r"`Scoring.ranked_by`"),  # pyright: ignore[reportArgumentType]  # bad input on purpose
    ],
)
def test_option_objects_refuse_bad_fields_by_name(
    build: Callable[[], Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        build()


def test_option_objects_normalise_numpy_values_and_stay_frozen() -> None:
    mlp = le.MLP(hidden=[np.int64(32), 16], standardize=np.True_)  # pyright: ignore[reportArgumentType]  # NumPy values on purpose
    assert mlp.hidden == (32, 16) and all(type(h) is int for h in mlp.hidden)
    assert mlp.standardize is True
    training = le.Training(epochs=np.int32(7), batch_size=np.int64(16), patience=None)  # pyright: ignore[reportArgumentType]  # NumPy values on purpose
    assert (training.epochs, training.batch_size, training.patience) == (7, 16, None)
    assert type(training.epochs) is int and type(training.batch_size) is int
    folds = le.Folds(np.int64(3), n_repeats=np.int8(2))  # pyright: ignore[reportArgumentType]  # NumPy values on purpose
    assert folds == le.Folds(3, 2) and type(folds.n_splits) is int
    assert hash(folds) == hash(le.Folds(3, 2))  # a frozen value: a dict key, a static argument
    for option, field in ((mlp, "hidden"), (folds, "n_splits"), (training, "epochs")):
        with pytest.raises(AttributeError):  # dataclasses.FrozenInstanceError
            setattr(option, field, 1)
    assert le.Classifier(mlp_apply, init=lambda key: W).params is None  # init may be a function


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("model", 64, r"`model` must be an MLP or a Classifier .* got int"),
        ("model", mlp_apply, r"`model` must be an MLP or a Classifier"),
        ("folds", 5, r"`folds` must be a Folds \(e\.g\. Folds\(5\)\), got int 5"),
        ("training", {"epochs": 3}, r"`training` must be a Training .* got dict"),
        ("scoring", "oof", r"`scoring` must be a Scoring .* got str 'oof'"),
    ],
)
def test_a_value_in_place_of_its_option_object_is_refused(
    option: str, value: Any, expected: str
) -> None:
    x, y = golden.data()
    with pytest.raises(TypeError, match=expected):
        le.find_label_errors(x, y, **{option: value})


def test_the_signature_is_at_most_eight_parameters_with_option_objects_as_defaults() -> None:
    params = inspect.signature(le.find_label_errors).parameters
    assert list(params) == [
        "x",
        "y",
        "model",
        "folds",
        "training",
        "scoring",
        "num_classes",
        "seed",
    ]
    defaults = {name: p.default for name, p in params.items()}
    assert isinstance(defaults["model"], le.MLP) and defaults["model"].hidden == (64,)
    assert defaults["model"].standardize is True and defaults["model"].params is None
    assert defaults["folds"] == le.Folds(5, None)
    assert defaults["training"] == le.Training(None, None, None, 5)
    assert defaults["scoring"] == le.Scoring("oof", "self_confidence")
    assert defaults["num_classes"] is None and defaults["seed"] == 0


# ---------------------------------------------------------------------------
# the same results as the 17 keywords (tests/data/label_errors_golden-jax*.npz)
# ---------------------------------------------------------------------------


def _new_call(name: str) -> dict[str, Any]:
    """The golden's calls (``golden.OLD_CALLS``) written with the option objects."""
    if name == "default":
        return {}
    if name == "options":
        old = golden.OLD_CALLS["options"]
        return {
            "model": le.MLP(hidden=(16, 8), standardize=False),
            "folds": le.Folds(n_splits=3, n_repeats=2),
            "training": le.Training(
                epochs=7, batch_size=16, optimizer=old["optimizer"], patience=None
            ),
            "scoring": le.Scoring(ranked_by="normalized_margin"),
            "num_classes": 4,
            "seed": 4,
        }
    assert name == "gradnorm"
    return {
        "model": le.MLP(params=golden.trained_params()),
        "scoring": le.Scoring(method="gradnorm"),
    }


def _assert_same_as_golden(issues: le.LabelIssues, name: str) -> None:
    for field in golden.FIELDS:
        got, want = np.asarray(getattr(issues, field)), GOLDEN[f"{name}/{field}"]
        assert got.shape == want.shape and got.dtype == want.dtype, field
        if want.dtype.kind == "f":  # a few float32 ulps of the largest value (see the top)
            tolerance = 8 * np.spacing(np.float32(np.abs(want).max()))
            np.testing.assert_allclose(got, want, rtol=0, atol=tolerance, err_msg=field)
        else:
            np.testing.assert_array_equal(got, want, err_msg=field)
    assert issues.num_issues == int(GOLDEN[f"{name}/num_issues"])
    best = np.asarray([run.best_epoch for run in issues.oof])
    np.testing.assert_array_equal(
        best.reshape(GOLDEN[f"{name}/best_epoch"].shape), GOLDEN[f"{name}/best_epoch"]
    )


@pytest.mark.parametrize("name", sorted(golden.OLD_CALLS))
def test_the_grouped_options_give_the_results_of_the_old_keywords(name: str) -> None:
    with (
        host_default()
    ):  # the golden was recorded on XLA:CPU: the runs are the host's on any machine
        x, y = golden.data()
        issues = le.find_label_errors(x, y, **_new_call(name))
    _assert_same_as_golden(issues, name)


def test_the_golden_default_call_is_a_real_out_of_fold_run() -> None:
    """The stored default is the old defaults' result: 4 repeats of 5 folds, early stopped."""
    assert GOLDEN["default/best_epoch"].shape == (4, 5)  # repeats 4 (90 rows), 5 folds
    assert GOLDEN["options/best_epoch"].shape == (2, 3)
    assert np.all(GOLDEN["options/best_epoch"] == 7)  # patience=None keeps the last of 7 epochs
    assert GOLDEN["options/pred_probs"].shape == (90, 4)  # num_classes=4
    assert GOLDEN["gradnorm/num_issues"] == 0 and GOLDEN["gradnorm/best_epoch"].size == 0
    x, y = golden.data()
    probs = GOLDEN["default/pred_probs"]
    np.testing.assert_allclose(probs.sum(1), 1.0, rtol=1e-12)
    # ranked by self-confidence: the score is p(given label), ascending
    np.testing.assert_array_equal(
        GOLDEN["default/score"], probs[GOLDEN["default/indices"], y[GOLDEN["default/indices"]]]
    )
    assert np.all(np.diff(GOLDEN["default/score"]) >= 0)
    assert jax.tree.leaves(golden.trained_params())[0].dtype == np.float32


def test_an_optimizer_in_training_is_used() -> None:
    """``Training.optimizer`` reaches the fold models (a zero learning rate keeps the init)."""
    x, y = golden.data()
    frozen = le.Training(epochs=2, optimizer=optax.sgd(0.0), patience=None)
    init = {"dense_0": {"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)}}
    found = le.find_label_errors(
        x, y, model=le.Classifier(mlp_apply, init=init), folds=le.Folds(3, 1), training=frozen
    )
    np.testing.assert_allclose(found.pred_probs, 1.0 / 3.0, rtol=1e-6)

"""The public API contract (docs/design.md, second round included): every name importable and
documented; Optax signature parity."""

import importlib
import inspect

import optax
import pytest

import jaxwise

CONTRACT = {
    "compilation": (
        "CompileCounter CompileBudget CompileBudgetExceeded compile_budget "
        "explain_recompiles stage_report CacheMiss"
    ),
    "buckets": "bucket_for pad_to_bucket plan_buckets BucketedFunction",
    "numerics": (
        "double_where safe_sqrt safe_log safe_norm sinc entropy logit cosine_similarity "
        "logsumexp softmax log_softmax mask_logits cross_entropy round_ste "
        "straight_through"
    ),
    "debug": "locate_nan NanReport checked assert_finite",
    "autodiff": "jacobian jvp_many hvp cg_solve newton_cg_step newton_cg",
    "per_example": (
        "per_example_grads per_example_grad_norms clip_and_sum ghost_coverage "
        "auto_chunk_size CoverageRow LossFn"
    ),
    "privacy": (
        "add_dp_noise dp_gradient dp_gradient_accumulated poisson_batch epsilon "
        "noise_multiplier_for make_dp_train_epoch audit_canaries empirical_epsilon Canaries"
    ),
    "label_errors": (
        "find_label_errors hardest_examples LabelIssues confident_learning "
        "out_of_fold_probabilities stratified_folds precision_recall OutOfFold "
        "MLP Classifier Folds Training Scoring"
    ),
    "optim": (
        "GradientTransformation apply_updates global_norm identity scale "
        "scale_by_schedule scale_by_learning_rate trace scale_by_adam scale_by_lion "
        "add_decayed_weights clip_by_global_norm freeze chain sgd adam adamw lion "
        "constant_schedule linear_schedule cosine_decay_schedule "
        "warmup_cosine_decay_schedule piecewise_constant_schedule join_schedules"
    ),
    "tree": "param_table path_names mask_by_path tree_allclose host_copy",
    "train": "TrainState make_train_step make_train_epoch fit check_donatable DonationError",
    "checkpoint": (
        "Checkpointer save restore CheckpointError CheckpointWarning latest_step "
        "load_metadata data_fingerprint"
    ),
    "sharding": "data_mesh fsdp_mesh state_shardings place_state place_batch",
    "sequence": (
        "lengths_to_mask masked_sum masked_mean segment_softmax segment_mean "
        "discounted_returns bounded_while linear_recurrence init_gru gru_cell init_lstm "
        "lstm_cell run_rnn rk4_step odeint_rk4 lambda_returns gae"
    ),
    "data": "make_spiral make_blobs flip_labels load_csv prefetch_to_device",
    "models": "init_mlp mlp_apply mlp_loss Model from_nnx from_linen from_equinox",
    "lint": "lint_source lint_paths RULES",
    "diagnose": "captured_constants why_recompiled",
    "cli": "main",
}


@pytest.mark.parametrize("module", CONTRACT)
def test_contract_names_exist_and_are_documented(module):
    mod = importlib.import_module(f"jaxwise.{module}")
    assert mod.__doc__ and len(mod.__doc__) > 80, module
    for name in CONTRACT[module].split():
        obj = getattr(mod, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), f"jaxwise.{module}.{name} has no docstring"


@pytest.mark.parametrize("module", [m for m in CONTRACT if m != "cli"])
def test_all_is_explicit_and_complete(module):
    mod = importlib.import_module(f"jaxwise.{module}")
    assert hasattr(mod, "__all__"), module
    for name in mod.__all__:
        obj = getattr(mod, name)
        if inspect.isfunction(obj) or inspect.isclass(obj):
            assert obj.__doc__, f"jaxwise.{module}.{name} has no docstring"
    for name in CONTRACT[module].split():
        assert name in mod.__all__, f"{name} missing from jaxwise.{module}.__all__"


def test_importing_jaxwise_does_not_import_jax():
    import subprocess
    import sys

    code = "import sys, jaxwise, jaxwise._shared._checks; print('jax' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_package_exposes_modules_and_version():
    for module in CONTRACT:
        if module not in ("cli", "lint", "diagnose"):
            assert getattr(jaxwise, module) is importlib.import_module(f"jaxwise.{module}")
    assert jaxwise.__version__


def _positional(fn):
    params = inspect.signature(fn).parameters.values()
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


SHARED_WITH_OPTAX = [
    n
    for n in CONTRACT["optim"].split()
    if inspect.isfunction(getattr(jaxwise.optim, n))
    and callable(getattr(optax, n, None))
    and n != "chain"
]  # chain takes *transformations in both


def test_most_optim_names_are_shared_with_optax():
    assert len(SHARED_WITH_OPTAX) >= 20


@pytest.mark.parametrize("name", SHARED_WITH_OPTAX)
def test_optim_signatures_match_optax(name):
    ours = getattr(jaxwise.optim, name)
    peer = getattr(optax, name)
    assert _positional(ours) == _positional(peer)[: len(_positional(ours))], (
        f"{name}: ours {_positional(ours)} vs optax {_positional(peer)}"
    )


@pytest.mark.parametrize("module", ["per_example", "privacy", "label_errors", "models"])
def test_namespace_exposes_exactly_its_all(module):
    """Helpers stay private: nothing but ``__all__`` is a public attribute of the namespace.

    (pytest's assertion rewriting of the plugin package adds ``@py_builtins``-style names,
    which are not identifiers and not reachable as attributes in user code.)
    """
    mod = importlib.import_module(f"jaxwise.{module}")
    public = {name for name in dir(mod) if not name.startswith("_") and name.isidentifier()}
    assert public == set(mod.__all__), (
        f"jaxwise.{module}: not in __all__ {sorted(public - set(mod.__all__))}, "
        f"missing {sorted(set(mod.__all__) - public)}"
    )


def test_per_example_does_not_import_models():
    import subprocess
    import sys

    code = (
        "import sys, jaxwise.per_example; "
        "print(sorted(m for m in sys.modules if m.startswith('jaxwise.models')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"

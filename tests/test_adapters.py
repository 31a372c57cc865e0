"""Tests for jaxwise.models adapters: NNX, linen and Equinox models as (params, state, apply)."""

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from flax.training import train_state

from jaxwise import label_errors, optim, per_example
from jaxwise._shared._params import check_params, model_library
from jaxwise.compilation import CompileCounter
from jaxwise.models import Model, from_equinox, from_linen, from_nnx
from jaxwise.train import TrainState, make_train_step


@pytest.fixture(autouse=True)
def standard_promotion():
    """Flax and Equinox layers rely on implicit promotion (conftest makes it strict)."""
    with jax.numpy_dtype_promotion("standard"):
        yield


def data(n=32, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x[:, 0] * x[:, 1] > 0).astype(np.int32)
    return jnp.asarray(x), jnp.asarray(y)


def cross_entropy(logits, y):
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def assert_trees_close(a, b, rtol=1e-6, atol=1e-6):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        if jnp.issubdtype(jnp.asarray(x).dtype, jax.dtypes.prng_key):
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=rtol, atol=atol)


def train_20_steps(model: Model, loss_of_output, steps=20, apply_kwargs=lambda key: {}):
    """A jitted optax loop over the adapter's apply; returns (losses, params, state, compiles)."""
    x, y = data()
    tx = optim.adam(2e-2)

    @jax.jit
    def step(params, state, opt_state, x, y, key):
        def loss_fn(p):
            out, new_state = model.apply(p, state, x, **apply_kwargs(key))
            return loss_of_output(out, y), new_state

        (loss, new_state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optim.apply_updates(params, updates), new_state, opt_state, loss

    params, state, opt_state = model.params, model.model_state, tx.init(model.params)
    losses = []
    with CompileCounter(step) as counter:
        for i in range(steps):
            params, state, opt_state, loss = step(params, state, opt_state, x, y, jax.random.key(i))
            losses.append(float(loss))
    return losses, params, state, counter.count


# ---------------------------------------------------------------------------
# Flax NNX: BatchNorm + Dropout
# ---------------------------------------------------------------------------


class NNXNet(nnx.Module):
    def __init__(self, rngs):
        self.l1 = nnx.Linear(3, 16, rngs=rngs)
        self.bn = nnx.BatchNorm(16, rngs=rngs)
        self.drop = nnx.Dropout(0.3, rngs=rngs)
        self.l2 = nnx.Linear(16, 2, rngs=rngs)

    def __call__(self, x):
        return self.l2(self.drop(jax.nn.relu(self.bn(self.l1(x)))))


def test_nnx_apply_equals_module_in_train_and_eval_mode_and_is_pure():
    x, _ = data()
    module = NNXNet(nnx.Rngs(0, dropout=1))
    model = from_nnx(module)
    assert isinstance(model.params, nnx.State) and isinstance(model.model_state, nnx.State)
    before = nnx.state(module)
    out, new_state = model.apply(model.params, model.model_state, x)
    assert_trees_close(nnx.state(module), before, rtol=0, atol=0)  # apply never mutates
    expected = module(x)  # the module itself, same dropout stream: same mask, same statistics
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    assert_trees_close(new_state, nnx.split(module, nnx.Param, ...)[2])
    assert not np.allclose(np.asarray(new_state["bn"]["mean"][...]), 0.0)  # statistics moved
    # eval mode: NNX's own static switch, on a view; same params and state
    evaluate = from_nnx(nnx.view(module, deterministic=True, use_running_average=True)).apply
    params, state = nnx.split(module, nnx.Param, ...)[1:]
    out_eval, state_after = evaluate(params, state, x)
    module.eval()
    np.testing.assert_allclose(np.asarray(out_eval), np.asarray(module(x)), rtol=1e-6, atol=1e-6)
    assert_trees_close(state_after, state, rtol=0, atol=0)  # eval: statistics untouched


def test_nnx_grads_flow_jit_compiles_once_and_vmap_matches_batch():
    x, y = data()
    model = from_nnx(NNXNet(nnx.Rngs(0)))

    def loss(params, state):
        out, new_state = model.apply(params, state, x)
        return cross_entropy(out, y), new_state

    grads, _ = jax.grad(loss, has_aux=True)(model.params, model.model_state)
    assert jax.tree.structure(grads) == jax.tree.structure(model.params)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
    jitted = jax.jit(model.apply)
    state = model.model_state
    with CompileCounter(jitted) as counter:
        for _ in range(3):
            _, state = jitted(model.params, state, x)
    assert counter.count == 1
    assert int(state["drop"]["rngs"]["count"][...]) == 3  # the dropout stream advanced
    eval_model = from_nnx(
        nnx.view(NNXNet(nnx.Rngs(0)), deterministic=True, use_running_average=True)
    )
    per_example, _ = jax.vmap(eval_model.apply, in_axes=(None, None, 0))(
        eval_model.params, eval_model.model_state, x
    )
    batched, _ = eval_model.apply(eval_model.params, eval_model.model_state, x)
    np.testing.assert_allclose(np.asarray(per_example), np.asarray(batched), rtol=1e-5, atol=1e-6)


def test_nnx_trains_20_steps_with_optax_and_batch_stats_change():
    model = from_nnx(NNXNet(nnx.Rngs(0)))
    losses, _, state, compiles = train_20_steps(model, cross_entropy, apply_kwargs=lambda key: {})
    assert compiles == 1
    assert losses[-1] < 0.8 * losses[0]
    assert not np.allclose(np.asarray(state["bn"]["var"][...]), 1.0)


def test_nnx_without_extra_variables_has_no_model_state():
    model = from_nnx(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))
    assert model.model_state is None
    with pytest.raises(ValueError, match="must be None"):
        model.apply(model.params, {}, jnp.ones(3))


def test_jaxwise_optimizer_drives_nnx_optimizer():
    module = NNXNet(nnx.Rngs(0))
    optimizer = nnx.Optimizer(module, optim.adamw(1e-2, mask="kernel"), wrt=nnx.Param)
    x, y = data()
    grads = nnx.grad(lambda m: cross_entropy(m(x), y))(module)
    optimizer.update(module, grads)
    assert int(optax.tree_utils.tree_get(nnx.state(optimizer, nnx.OptState), "count")[...]) == 1


# ---------------------------------------------------------------------------
# Flax linen: BatchNorm + Dropout
# ---------------------------------------------------------------------------


class LinenNet(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool = True):
        x = nn.Dense(16)(x)
        x = nn.BatchNorm(use_running_average=not train, momentum=0.9)(x)
        x = nn.Dropout(0.3, deterministic=not train)(nn.relu(x))
        return nn.Dense(2)(x)


def linen_model():
    net = LinenNet()
    variables = net.init(jax.random.key(0), jnp.ones((1, 3)), train=False)
    return net, variables, from_linen(net, variables)


def test_linen_apply_equals_module_in_train_and_eval_mode():
    x, _ = data()
    net, variables, model = linen_model()
    assert set(model.model_state) == {"batch_stats"} and "Dense_0" in model.params
    rngs = {"dropout": jax.random.key(3)}
    out, new_state = model.apply(model.params, model.model_state, x, train=True, rngs=rngs)
    expected, updates = net.apply(variables, x, train=True, rngs=rngs, mutable=["batch_stats"])
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    assert_trees_close(new_state, dict(updates))
    out_eval, same_state = model.apply(model.params, new_state, x, train=False)
    expected_eval = net.apply({"params": model.params, **new_state}, x, train=False)
    np.testing.assert_allclose(
        np.asarray(out_eval), np.asarray(expected_eval), rtol=1e-6, atol=1e-6
    )
    assert_trees_close(same_state, new_state, rtol=0, atol=0)


def test_linen_grads_jit_once_vmap_and_20_steps():
    x, y = data()
    _, _, model = linen_model()
    grads = jax.grad(
        lambda p: cross_entropy(model.apply(p, model.model_state, x, train=False)[0], y)
    )(model.params)
    assert all(float(jnp.abs(g).max()) > 0 for g in jax.tree.leaves(grads))
    jitted = jax.jit(model.apply, static_argnames="train")
    with CompileCounter(jitted) as counter:
        state = model.model_state
        for i in range(3):
            _, state = jitted(
                model.params, state, x, train=True, rngs={"dropout": jax.random.key(i)}
            )
    assert counter.count == 1
    per_example, _ = jax.vmap(lambda xi: model.apply(model.params, state, xi[None], train=False))(x)
    batched, _ = model.apply(model.params, state, x, train=False)
    np.testing.assert_allclose(
        np.asarray(per_example[:, 0]), np.asarray(batched), rtol=1e-5, atol=1e-6
    )
    losses, _, state, compiles = train_20_steps(
        model, cross_entropy, apply_kwargs=lambda key: {"train": True, "rngs": {"dropout": key}}
    )
    assert compiles == 1 and losses[-1] < 0.8 * losses[0]
    assert not np.allclose(np.asarray(state["batch_stats"]["BatchNorm_0"]["mean"]), 0.0)


def test_linen_bad_input():
    net, variables, model = linen_model()
    with pytest.raises(TypeError, match="do not pass `mutable`"):
        model.apply(model.params, model.model_state, jnp.ones((2, 3)), mutable=["batch_stats"])
    with pytest.raises(ValueError, match=r"collections \['batch_stats'\]"):
        model.apply(model.params, None, jnp.ones((2, 3)))
    with pytest.raises(TypeError, match="'params' collection"):
        from_linen(net, variables["params"]["Dense_0"]["kernel"])
    with pytest.raises(TypeError, match="flax.linen.Module"):
        from_linen(variables, net)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    plain = nn.Dense(2)
    only_params = from_linen(plain, plain.init(jax.random.key(0), jnp.ones((1, 3))))
    assert only_params.model_state is None


# ---------------------------------------------------------------------------
# Equinox: an MLP, and a model with BatchNorm (eqx.nn.State) + Dropout
# ---------------------------------------------------------------------------


class EqxNet(eqx.Module):
    l1: eqx.nn.Linear
    bn: eqx.nn.BatchNorm
    drop: eqx.nn.Dropout
    l2: eqx.nn.Linear

    def __init__(self, key):
        k1, k2 = jax.random.split(key)
        self.l1 = eqx.nn.Linear(3, 16, key=k1)
        self.bn = eqx.nn.BatchNorm(16, axis_name="batch", momentum=0.9, mode="ema")
        self.drop = eqx.nn.Dropout(0.3)
        self.l2 = eqx.nn.Linear(16, 2, key=k2)

    def __call__(self, x, state, *, key=None):
        x, state = self.bn(self.l1(x), state)
        return self.l2(self.drop(jax.nn.relu(x), key=key)), state


def batched(apply):
    """Equinox models take one example: vmap over the batch, BatchNorm's axis named "batch"."""
    return jax.vmap(apply, in_axes=(None, None, 0), out_axes=(0, None), axis_name="batch")


def test_equinox_mlp_apply_grad_jit_vmap():
    x, y = data()
    mlp = eqx.nn.MLP(3, 2, 16, 2, key=jax.random.key(0))
    model = from_equinox(mlp)
    assert model.model_state is None
    out, state = jax.vmap(model.apply, in_axes=(None, None, 0))(model.params, None, x)
    np.testing.assert_allclose(np.asarray(out), np.asarray(jax.vmap(mlp)(x)), rtol=1e-6, atol=1e-6)
    assert state is None

    def loss(params):
        return cross_entropy(jax.vmap(model.apply, in_axes=(None, None, 0))(params, None, x)[0], y)

    ours = jax.grad(loss)(model.params)
    peer = eqx.filter_grad(lambda m: cross_entropy(jax.vmap(m)(x), y))(mlp)
    assert_trees_close(ours, eqx.filter(peer, eqx.is_inexact_array))
    jitted = jax.jit(model.apply)
    with CompileCounter(jitted) as counter:
        for i in range(3):
            jitted(model.params, None, x[i])
    assert counter.count == 1
    losses, *_, compiles = train_20_steps(
        Model(
            model.params,
            None,
            lambda p, s, x: (jax.vmap(model.apply, in_axes=(None, None, 0))(p, s, x)[0], s),
        ),
        cross_entropy,
        apply_kwargs=lambda key: {},
    )
    assert compiles == 1 and losses[-1] < 0.8 * losses[0]


def test_equinox_batchnorm_state_dropout_key_and_inference_mode():
    x, y = data()
    module, state = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    model = from_equinox(module, state)
    assert isinstance(model.model_state, eqx.nn.State)
    keys = jax.random.split(jax.random.key(5), x.shape[0])
    out, new_state = batched(model.apply)(model.params, model.model_state, x, key=keys)
    expected, expected_state = jax.vmap(
        lambda xi, s, k: module(xi, s, key=k),
        in_axes=(0, None, 0),
        out_axes=(0, None),
        axis_name="batch",
    )(x, state, keys)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    assert_trees_close(new_state, expected_state)
    # eval: Equinox's own inference_mode, same params and state
    inference = eqx.nn.inference_mode(module)
    out_eval, _ = batched(from_equinox(inference, state).apply)(model.params, new_state, x)
    expected_eval, _ = jax.vmap(
        inference, in_axes=(0, None), out_axes=(0, None), axis_name="batch"
    )(x, new_state)
    np.testing.assert_allclose(
        np.asarray(out_eval), np.asarray(expected_eval), rtol=1e-6, atol=1e-6
    )
    train_apply = Model(
        model.params,
        model.model_state,
        lambda p, s, xb, key: batched(model.apply)(
            p, s, xb, key=jax.random.split(key, xb.shape[0])
        ),
    )
    losses, _, final_state, compiles = train_20_steps(
        train_apply, cross_entropy, apply_kwargs=lambda key: {"key": key}
    )
    assert compiles == 1 and losses[-1] < 0.8 * losses[0]
    moved = [
        not np.allclose(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(final_state), jax.tree.leaves(state))
    ]
    assert any(moved)


def test_equinox_bad_input():
    mlp = eqx.nn.MLP(3, 2, 16, 2, key=jax.random.key(0))
    with pytest.raises(TypeError, match="eqx.nn.State"):
        from_equinox(mlp, {"not": "a state"})  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="separate arguments"):
        from_equinox(eqx.nn.make_with_state(EqxNet)(jax.random.key(0)))  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="equinox.Module"):
        from_equinox(nnx.Linear(3, 2, rngs=nnx.Rngs(0)))  # pyright: ignore[reportArgumentType]  # bad input on purpose


# ---------------------------------------------------------------------------
# Model objects where arrays are expected; Flax train states
# ---------------------------------------------------------------------------


def test_check_params_names_the_adapter():
    linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    with pytest.raises(
        TypeError,
        match=r"the flax.nnx model object Linear; split the model first: "
        r"`model = jaxwise.models.from_nnx\(module\)`",
    ):
        check_params(linear)
    with pytest.raises(TypeError, match=r"`init_params` .*flax.linen model object .*from_linen"):
        check_params(LinenNet(), "init_params")
    mlp = eqx.nn.MLP(3, 2, 16, 2, key=jax.random.key(0))
    with pytest.raises(
        TypeError,
        match=r"equinox model object MLP; split the model first \(it holds non-array fields\)",
    ):
        check_params(mlp)
    with pytest.raises(TypeError, match="leaf `layer.1` is a function"):
        check_params({"layer": [jnp.ones(2), lambda z: z]})
    with pytest.raises(TypeError, match="got a jaxwise.models.Model; pass its `.params`"):
        check_params(from_equinox(mlp))
    _, variables, _ = linen_model()
    with pytest.raises(TypeError, match=r"Flax linen `variables` \(collections \['batch_stats', "):
        check_params(variables)
    check_params(from_equinox(mlp).params)  # an Equinox module of arrays IS a params tree
    check_params(from_nnx(linear).params)
    check_params({"w": np.ones(2), "b": 0.5, "h": jnp.ones(2, jnp.bfloat16)})
    assert model_library(linear) == "flax.nnx" and model_library(mlp) == "equinox"
    assert model_library(LinenNet()) == "flax.linen" and model_library({}) is None


@pytest.mark.parametrize(
    ("params", "error", "match"),
    [
        ({"w": jnp.ones(2), "n": jnp.ones(2, jnp.int32)}, TypeError, "leaf `n` has dtype int32"),
        ({"a": [jnp.ones(2), np.ones(1, bool)]}, TypeError, "leaf `a.1` has dtype bool"),
        ({"z": jnp.ones(2, jnp.complex64)}, TypeError, "leaf `z` has dtype complex64"),
        ({"s": 3}, TypeError, "leaf `s` has dtype int64"),
        ({}, ValueError, "params` has no array leaves"),  # `params`, `MLP.params`
        (None, TypeError, "`params`"),
    ],
)
def test_params_must_be_float_arrays_everywhere(params, error, match):
    """The one check, at every boundary that takes parameters."""
    x = jnp.ones((4, 2))
    calls = [
        lambda: check_params(params),
        lambda: per_example.per_example_grads(lambda p, e: jnp.sum(e), params, x),
        lambda: per_example.ghost_coverage(lambda p, e: jnp.sum(e), params, x[0]),
        lambda: TrainState.create(params, optim.sgd(0.1), 0),
        lambda: label_errors.find_label_errors(
            x,
            jnp.zeros(4, jnp.int32),
            model=label_errors.MLP(params=params),
            scoring=label_errors.Scoring(method="gradnorm"),
        ),
    ]
    for call in calls:
        with pytest.raises(error, match=match):
            call()


def test_model_objects_are_named_at_every_boundary():
    linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    x = jnp.ones((4, 3))
    for call in (
        lambda: per_example.per_example_grad_norms(lambda p, e: jnp.sum(e), linear, x),
        lambda: TrainState.create(linear, optim.sgd(0.1), 0),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        lambda: TrainState.create({"w": x}, optim.sgd(0.1), 0, model_state=linear),
        lambda: label_errors.Classifier(lambda p, xb: xb, params=linear),
    ):
        with pytest.raises(TypeError, match=r"flax.nnx model object Linear; .*from_nnx"):
            call()


def test_flax_train_states_are_recognised():
    linear = nnx.Linear(3, 2, rngs=nnx.Rngs(0))
    net = nn.Dense(2)
    variables = net.init(jax.random.key(0), jnp.ones((1, 3)))
    flax_state = train_state.TrainState.create(
        apply_fn=net.apply, params=variables["params"], tx=optax.sgd(0.1)
    )
    step = make_train_step(lambda p, b: jnp.sum(p["kernel"]))
    with pytest.raises(
        TypeError,
        match=r"`state` must be a jaxwise.train.TrainState .*"
        r"got flax.training.train_state.TrainState",
    ):
        step(flax_state, jnp.ones(3))  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="got a flax.nnx.Optimizer; pass its `.params`"):
        check_params(nnx.Optimizer(linear, optax.sgd(0.1), wrt=nnx.Param))
    with pytest.raises(TypeError, match="pass its `.params`"):
        check_params(flax_state)


def test_adapters_reject_non_modules():
    with pytest.raises(TypeError, match="flax.nnx.Module, got dict"):
        from_nnx({"w": jnp.ones(2)})  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_nnx_trainable_filter_state_checks_and_program_name():
    x, _ = data()
    module = NNXNet(nnx.Rngs(0))
    model = from_nnx(module, trainable=(nnx.Param, nnx.BatchStat))  # statistics trained too
    assert "mean" in model.params["bn"] and "bn" not in model.model_state
    with pytest.raises(ValueError, match="non-trainable state"):
        model.apply(model.params, None, x)
    jitted = jax.jit(from_nnx(module).apply)
    with CompileCounter("apply_NNXNet") as counter:  # the program is named after the model
        jitted(*nnx.split(module, nnx.Param, ...)[1:], x)
    assert counter.count == 1


# ---------------------------------------------------------------------------
# Under DP-SGD: BatchNorm in training mode refused or frozen, RNG streams carried
# ---------------------------------------------------------------------------


def test_linen_rng_stream_is_carried_in_the_state_and_split_on_every_call():
    x, _ = data()
    net, variables = LinenNet(), LinenNet().init(jax.random.key(0), jnp.ones((1, 3)), train=False)
    model = from_linen(net, variables, rngs={"dropout": jax.random.key(7)})
    assert set(model.model_state) == {"batch_stats", "rngs"}
    out, state = model.apply(model.params, model.model_state, x, train=True)
    carried, used = jax.random.split(jax.random.key(7))
    expected, _ = net.apply(
        variables, x, train=True, rngs={"dropout": used}, mutable=["batch_stats"]
    )
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    assert_trees_close(state["rngs"]["dropout"], carried, rtol=0, atol=0)
    again, _ = model.apply(model.params, state, x, train=True)  # the next step: a new mask
    assert not np.allclose(np.asarray(again), np.asarray(out))
    with pytest.raises(TypeError, match="do not pass `rngs`"):
        model.apply(model.params, state, x, rngs={"dropout": jax.random.key(0)})
    with pytest.raises(TypeError, match=r"`rngs\['dropout'\]` must be one typed key"):
        from_linen(net, variables, rngs={"dropout": jax.random.PRNGKey(0)})  # noqa: JW004
    with pytest.raises(TypeError, match="must map stream names"):
        from_linen(net, variables, rngs=jax.random.key(0))  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="collection named 'rngs'"):
        from_linen(net, {**variables, "rngs": {}}, rngs={"dropout": jax.random.key(0)})


def test_equinox_key_stream_is_carried_in_the_state_and_split_on_every_call():
    x, _ = data()
    module, state = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    model = from_equinox(eqx.nn.inference_mode(module, False), state, key=jax.random.key(3))
    assert set(model.model_state) == {"state", "key"}
    inference = from_equinox(eqx.nn.inference_mode(module), state, key=jax.random.key(3))
    out, new = inference.apply(model.params, inference.model_state, x[0])
    carried, used = jax.random.split(jax.random.key(3))
    expected, _ = eqx.nn.inference_mode(module)(x[0], state, key=used)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)
    assert_trees_close(new["key"], carried, rtol=0, atol=0)
    with pytest.raises(TypeError, match="do not pass `key`"):
        model.apply(model.params, model.model_state, x[0], key=jax.random.key(0))
    with pytest.raises(ValueError, match="'state': ..., 'key'"):
        model.apply(model.params, state, x[0])
    with pytest.raises(TypeError, match="must be one typed key"):
        from_equinox(module, state, key=jax.random.PRNGKey(0))  # noqa: JW004


class NNXBlock(nnx.Module):
    def __init__(self, rngs):
        self.inner = nnx.List([nnx.Linear(3, 4, rngs=rngs), nnx.BatchNorm(4, rngs=rngs)])

    def __call__(self, x):
        return self.inner[1](self.inner[0](x))


class LinenBlock(nn.Module):
    @nn.compact
    def __call__(self, x, train: bool):
        return nn.BatchNorm(use_running_average=not train, name="norm")(nn.Dense(4)(x))


def _refused_or_frozen(library):
    """(apply of a model with BatchNorm in training mode, its eval-mode output, layer path)."""
    x, _ = data(8)
    if library == "nnx":
        module = NNXBlock(nnx.Rngs(0))
        model = from_nnx(module)
        evaluated = from_nnx(nnx.view(module, use_running_average=True))
        expected = evaluated.apply(model.params, model.model_state, x)[0]
        return lambda: model.apply(model.params, model.model_state, x), expected, "inner.1"
    if library == "linen":
        net = LinenBlock()
        variables = net.init(jax.random.key(0), x, train=False)
        model = from_linen(net, variables)
        expected = net.apply(variables, x, train=False)
        return lambda: model.apply(model.params, model.model_state, x, train=True), expected, "norm"
    module, state = eqx.nn.make_with_state(EqxNet)(jax.random.key(0))
    inference = eqx.nn.inference_mode(module)  # dropout off; BatchNorm in training mode:
    model = from_equinox(eqx.tree_at(lambda m: m.bn.inference, inference, False), state)
    expected = inference(x[0], state)[0]
    return lambda: model.apply(model.params, model.model_state, x[0]), expected, "bn"


@pytest.mark.parametrize("library", ["nnx", "linen", "equinox"])
def test_batch_norm_in_training_mode_is_refused_or_frozen_under_dp(library):
    from jaxwise._shared._model_modes import private_training

    call, expected, path = _refused_or_frozen(library)
    with private_training(freeze=False), pytest.raises(ValueError) as err:
        call()
    assert f"BatchNorm layer `{path}`" in str(err.value)
    assert "GroupNorm or LayerNorm" in str(err.value) and "freeze_model_state=True" in str(
        err.value
    )
    with private_training(freeze=True):
        out, _ = call()
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-5, atol=1e-5)

"""DP-SGD through the one training loop: make_dp_train_epoch is a make_train_epoch configuration."""

import dataclasses

import equinox as eqx
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from host64 import mesh_devices

from jaxwise import optim
from jaxwise.compilation import CompileBudget
from jaxwise.models import from_equinox, from_linen, from_nnx
from jaxwise.privacy import (
    DPGradientFn,
    PoissonSampler,
    add_dp_noise,
    dp_gradient,
    dp_gradient_accumulated,
    dp_gradient_fn,
    make_dp_train_epoch,
    poisson_batch,
)
from jaxwise.sharding import data_mesh
from jaxwise.train import DonationError, ShuffleSampler, TrainState, make_epoch
from jaxwise.tree import host_copy


@pytest.fixture
def standard_promotion():
    """Flax and Equinox layers rely on implicit promotion (conftest makes it strict)."""
    with jax.numpy_dtype_promotion("standard"):
        yield


def sq_loss(w, example):
    """A per-example squared error of a linear model."""
    x, y = example
    return (jnp.dot(x, w) - y) ** 2


def sq_loss_dict(w, example):
    """The same loss with the example as a dict."""
    return (jnp.dot(example["x"], w) - example["y"]) ** 2


def make_problem(n=96, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = (x @ np.asarray([1.0, -2.0, 0.5])).astype(np.float32)
    return jnp.asarray(x), jnp.asarray(y)


def sampled_rows(state_key, n, batch_size, multiple):
    """The rows each step of one Poisson epoch samples (the sampler's plan replayed outside)."""
    sampler = PoissonSampler(batch_size, multiple)
    keys, _ = sampler.plan(state_key, jnp.int32(0), n)
    rows = []
    for k in keys:
        idx, mask, _ = poisson_batch(k, n, batch_size / n, sampler.width(n))
        rows.append(set(np.asarray(idx)[np.asarray(mask)].tolist()))
    return rows


def dp_epoch(loss, sampler, *, mesh=None, **dp):
    """``make_epoch(dp_gradient_fn(loss, **dp), sampler, mesh=mesh)``: the composed DP epoch."""
    return make_epoch(dp_gradient_fn(loss, **dp), sampler, mesh=mesh)


@pytest.mark.slow  # long: runs in the newest lane (make test), not the oldest
def test_dp_epoch_with_mesh_skips_exactly_the_steps_that_sample_a_nan_row():
    mesh = data_mesh(mesh_devices(4))
    tx = optim.sgd(0.05)
    x, y = make_problem()
    x = x.at[jnp.asarray([7, 40]), 1].set(jnp.nan)  # two poisoned examples
    epoch = dp_epoch(sq_loss, PoissonSampler(16, 4), mesh=mesh, clip_norm=5.0, noise_multiplier=0.5)
    state = TrainState.create(jnp.zeros(3), tx, jax.random.key(3))
    rows = sampled_rows(state.key, 96, 16, 4)
    with CompileBudget(1, epoch, exact=True):
        new, metrics = epoch(state, (x, y))
    expected = np.asarray([bool(r & {7, 40}) for r in rows], np.int32)
    assert expected.any() and not expected.all()  # the seed makes both kinds of steps happen
    np.testing.assert_array_equal(np.asarray(metrics["skipped"]), expected)
    assert int(new.step) == len(rows)  # a DP step counts (for the accountant) even when skipped
    assert np.isfinite(np.asarray(new.params)).all()
    np.testing.assert_array_equal(np.asarray(metrics["batch_size"]), [len(r) for r in rows])
    assert epoch.sampler.facts(96).sized().width % 4 == 0 and set(metrics) >= {
        "grad_norm",
        "skipped",
        "clipped_fraction",
    }
    assert epoch.jitted.__name__ == "sq_loss_train_epoch"  # pyright: ignore[reportAttributeAccessIssue]  # jit copies __name__ at run time


def test_dp_epoch_with_mesh_equals_single_device():
    tx = optim.sgd(0.05)
    x, y = make_problem()
    one = make_dp_train_epoch(sq_loss, 16, clip_norm=1.0, noise_multiplier=0.7)
    four = dp_epoch(
        sq_loss_dict,
        PoissonSampler(16, 4),
        mesh=data_mesh(mesh_devices(4)),
        clip_norm=1.0,
        noise_multiplier=0.7,
    )
    s1 = TrainState.create(jnp.zeros(3), tx, 5)
    s4 = TrainState.create(jnp.zeros(3), tx, 5)
    for _ in range(2):
        s1, m1 = one(s1, (x, y))
        s4, m4 = four(s4, {"x": x, "y": y})  # a dict batch on the mesh, a tuple on one device
    np.testing.assert_allclose(np.asarray(s4.params), np.asarray(s1.params), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(m4["batch_size"]), np.asarray(m1["batch_size"]))  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    assert s4.params.sharding.is_fully_replicated


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_dp_step_equals_a_float64_dp_sgd_step(form):
    """One shuffled DP step replayed in NumPy float64: clip, sum, the same noise, divide, SGD."""
    tx = optim.sgd(0.1)
    x, y = make_problem(n=8)
    w0 = np.asarray([0.3, -0.2, 0.1])
    loss, data = (sq_loss, (x, y)) if form == "tuple" else (sq_loss_dict, {"x": x, "y": y})
    epoch = dp_epoch(loss, ShuffleSampler(8), clip_norm=2.0, noise_multiplier=0.5)
    state = TrainState.create(jnp.asarray(w0, jnp.float32), tx, jax.random.key(11))
    key = jax.random.wrap_key_data(jnp.array(jax.random.key_data(state.key), copy=True))
    new, metrics = epoch(state, data)
    # replay: the shuffle keeps the key; the step splits (key, step_key); the noise uses step_key
    _, step_key = jax.random.split(key)
    x64, y64 = np.asarray(x, np.float64), np.asarray(y, np.float64)
    grads = 2 * (x64 @ w0 - y64)[:, None] * x64
    norms = np.linalg.norm(grads, axis=1)
    clipped = grads * np.minimum(1.0, 2.0 / norms)[:, None]
    noise = np.asarray(add_dp_noise(jnp.zeros(3), step_key, 2.0, 0.5, 1.0), np.float64)
    expected = w0 - 0.1 * (clipped.sum(0) + noise) / 8
    np.testing.assert_allclose(np.asarray(new.params), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(metrics["grad_norm_mean"][0]), norms.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(metrics["clipped_fraction"][0]), (norms > 2.0).mean())


def test_dp_epoch_audits_donation_and_keeps_its_accounting_helpers():
    tx = optim.sgd(0.05)
    x, y = make_problem()
    epoch = make_dp_train_epoch(sq_loss, 24, clip_norm=1.0, noise_multiplier=1.0)
    assert epoch.steps_per_epoch(96) == 4 and epoch.sample_rate(96) == 0.25
    assert isinstance(epoch.gradient, DPGradientFn)
    assert epoch.gradient.clip_norm == 1.0 and epoch.sampler == PoissonSampler(24)
    state = TrainState.create(jnp.zeros(3), tx, 0)
    old = state
    state, _ = epoch(state, (x, y))
    with pytest.raises(DonationError, match="the array at `step` was already deleted"):
        epoch(old, (x, y))
    snapshot = host_copy(state)
    with pytest.raises(ValueError, match="larger than the dataset"):
        epoch(state, (x[:10], y[:10]))
    with pytest.raises(ValueError, match="leading"):
        epoch(state, {"x": x, "y": y[:50]})
    assert not state.params.is_deleted()
    np.testing.assert_array_equal(np.asarray(state.params), snapshot.params)
    with pytest.raises(TypeError, match="`sampler` must be a jaxwise.train.Sampler"):
        dp_epoch(sq_loss, "uniform", clip_norm=1.0, noise_multiplier=1.0)
    with pytest.raises(TypeError, match="`batch_size` must be an int"):
        make_dp_train_epoch(sq_loss, 4.5, clip_norm=1.0, noise_multiplier=1.0)  # pyright: ignore[reportArgumentType]  # bad input on purpose


# ---------------------------------------------------------------------------
# Model state under DP: refused when computed from the examples, carried otherwise
# ---------------------------------------------------------------------------


def masked_loss(w, state, example):
    """A linear model behind a dropout-like mask drawn from the state's key and counter."""
    x, y = example
    mask = jax.random.bernoulli(jax.random.fold_in(state["key"], state["count"]), 0.5, x.shape)
    mask = mask.astype(x.dtype)
    return (jnp.dot(x * mask, w) - y) ** 2, {"key": state["key"], "count": state["count"] + 1}


@pytest.mark.parametrize("method", ["ghost", "vmap"])
def test_stateful_dp_gradient_equals_a_float64_reference(method):
    """Every example folds its index into the state's key for its mask; the state advances once."""
    x, y = make_problem(n=6)
    w0 = np.asarray([0.3, -0.2, 0.1])
    state = {"key": jax.random.key(4), "count": jnp.uint32(2)}
    grads, norms, new_state, _ = jax.jit(
        lambda w, s, b: dp_gradient(
            masked_loss,
            w,
            b,
            jax.random.key(0),
            clip_norm=1.5,
            noise_multiplier=0.0,
            model_state=s,
            method=method,
        )
    )(jnp.asarray(w0, jnp.float32), state, (x, y))
    masks = np.stack(
        [
            np.asarray(
                jax.random.bernoulli(
                    jax.random.fold_in(jax.random.fold_in(state["key"], i), 2), 0.5, (3,)
                )
            )
            for i in range(6)
        ]
    ).astype(np.float64)
    assert len({tuple(m) for m in masks}) > 1  # the examples' masks differ
    xm = np.asarray(x, np.float64) * masks
    per_example = 2 * (xm @ w0 - np.asarray(y, np.float64))[:, None] * xm
    ref_norms = np.linalg.norm(per_example, axis=1)
    factor = 1.5 / np.maximum(ref_norms, 1.5)  # min(1, C / norm), 1 for a zero gradient
    clipped = per_example * factor[:, None]
    assert (ref_norms > 1.5).any() and (ref_norms < 1.5).any()
    np.testing.assert_allclose(np.asarray(norms), ref_norms, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grads), clipped.mean(0), rtol=1e-5, atol=1e-7)
    assert int(new_state["count"]) == 3
    np.testing.assert_array_equal(
        jax.random.key_data(new_state["key"]), jax.random.key_data(state["key"])
    )


def test_state_computed_from_the_examples_is_refused_by_path():
    def ema_loss(w, state, x):
        new = {"count": state["count"] + 1, "ema": 0.9 * state["ema"] + 0.1 * x}
        return jnp.sum(w * x), new

    state = {"count": jnp.int32(0), "ema": jnp.zeros(3)}
    with pytest.raises(ValueError) as err:
        dp_gradient(
            ema_loss,
            jnp.ones(3),
            jnp.ones((4, 3)),
            jax.random.key(0),
            clip_norm=1.0,
            noise_multiplier=1.0,
            model_state=state,
        )
    message = str(err.value)
    assert "model state computed from the examples `ema`:" in message and "`count`" not in message
    assert "GroupNorm or LayerNorm" in message and "freeze_model_state=True" in message

    def pooled(w, x):  # a collective over a batch axis: what eqx.nn.BatchNorm does
        return jnp.sum(w * (x - jax.lax.pmean(x, "batch")))

    with pytest.raises(ValueError, match="over the named axis `batch`"):
        dp_gradient(
            pooled,
            jnp.ones(3),
            jnp.ones((4, 3)),
            jax.random.key(0),
            clip_norm=1.0,
            noise_multiplier=1.0,
        )
    with pytest.raises(TypeError, match=r"must return \(loss, new_model_state\)"):
        dp_gradient(
            lambda w, s, x: jnp.sum(w * x),
            jnp.ones(3),
            jnp.ones((4, 3)),
            jax.random.key(0),
            clip_norm=1.0,
            noise_multiplier=1.0,
            model_state=state,
        )
    with pytest.raises(TypeError, match="`freeze_model_state` must be a bool"):
        dp_gradient(
            lambda w, x: jnp.sum(w * x),
            jnp.ones(3),
            jnp.ones((4, 3)),
            jax.random.key(0),
            clip_norm=1.0,
            noise_multiplier=1.0,
            freeze_model_state="yes",  # pyright: ignore[reportArgumentType]  # bad input on purpose
        )


class DropoutNNX(nnx.Module):
    def __init__(self, rngs):
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(x))


class DropoutLinen(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(1)(nn.Dropout(0.5, deterministic=False)(x))


class DropoutEqx(eqx.Module):
    drop: eqx.nn.Dropout
    out: eqx.nn.Linear

    def __init__(self, key):
        self.drop, self.out = eqx.nn.Dropout(0.5), eqx.nn.Linear(8, 1, key=key)

    def __call__(self, x, *, key):
        return self.out(self.drop(x, key=key))


def dropout_model(library):
    """A model whose only state is a dropout RNG stream, as each adapter carries it."""
    if library == "nnx":
        return from_nnx(DropoutNNX(nnx.Rngs(0, dropout=1))), 1
    if library == "linen":
        net = DropoutLinen()
        variables = net.init(
            {"params": jax.random.key(0), "dropout": jax.random.key(1)}, jnp.ones((1, 8))
        )
        return from_linen(net, variables, rngs={"dropout": jax.random.key(2)}), 1
    return from_equinox(DropoutEqx(jax.random.key(0)), key=jax.random.key(2)), 0


@pytest.mark.parametrize("library", ["nnx", "linen", "equinox"])
def test_dropout_masks_differ_between_examples_and_steps(library, standard_promotion):
    model, batch_axis = dropout_model(library)

    def loss(params, state, x):
        out, new_state = model.apply(params, state, x[None] if batch_axis else x)
        return jnp.sum(out**2), new_state

    @jax.jit
    def step(p, s, b):
        return dp_gradient(
            loss,
            p,
            b,
            jax.random.key(0),
            clip_norm=float("inf"),
            noise_multiplier=0.0,
            model_state=s,
        )

    same = jnp.ones((6, 8))  # six identical examples: only the masks tell them apart
    with CompileBudget(1, step, exact=True):
        _, norms, state, _ = step(model.params, model.model_state, same)
        _, norms_next, state_next, _ = step(model.params, state, same)
    assert len(set(np.round(np.asarray(norms), 5).tolist())) > 1  # masks differ between examples
    assert not np.allclose(np.asarray(norms_next), np.asarray(norms))  # and between steps
    assert jax.tree.structure(state_next) == jax.tree.structure(model.model_state)


class DropoutCNN(nnx.Module):
    """Conv → norm (GroupNorm, or BatchNorm) → ReLU → Dropout → Dense, for 6 × 6 images."""

    def __init__(self, rngs, norm="group"):
        self.conv = nnx.Conv(1, 4, (3, 3), rngs=rngs)
        if norm == "group":
            self.norm = nnx.GroupNorm(4, num_groups=2, rngs=rngs)
        else:
            self.norm = nnx.BatchNorm(4, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(4 * 6 * 6, 3, rngs=rngs)

    def __call__(self, x):
        h = self.drop(nnx.relu(self.norm(self.conv(x))))
        return self.out(h.reshape(h.shape[0], -1))


def cnn_loss(model):
    def loss(params, state, example):
        image, label = example
        logits, new_state = model.apply(params, state, image[None])
        return -jax.nn.log_softmax(logits[0])[label], new_state

    return loss


def test_dp_epoch_of_an_nnx_cnn_with_dropout_draws_new_masks_every_step(standard_promotion):
    """Identical examples and a zero learning rate: only dropout makes the steps differ."""
    model = from_nnx(DropoutCNN(nnx.Rngs(0, dropout=1)))
    tx = optim.sgd(1e-12)
    image = jax.random.normal(jax.random.key(1), (1, 6, 6, 1))
    data = (jnp.repeat(image, 24, axis=0), jnp.zeros(24, jnp.int32))
    epoch = dp_epoch(
        cnn_loss(model),
        ShuffleSampler(8),
        clip_norm=1.0,
        noise_multiplier=0.0,
        takes_model_state=True,
    )
    state = TrainState.create(model.params, tx, 0, model_state=model.model_state)
    norms = []
    with CompileBudget(1, epoch, exact=True):
        for _ in range(3):
            state, metrics = epoch(state, data)
            norms.append(np.asarray(metrics["grad_norm"]))
    norms = np.concatenate(norms)
    assert len(set(np.round(norms, 6).tolist())) == 9  # a new mask at every one of the 9 steps
    assert int(state.model_state["drop"]["rngs"]["count"][...]) == 9
    still = from_nnx(nnx.view(DropoutCNN(nnx.Rngs(0, dropout=1)), deterministic=True))
    control = dp_epoch(
        cnn_loss(still),
        ShuffleSampler(8),
        clip_norm=1.0,
        noise_multiplier=0.0,
        takes_model_state=True,
    )
    _, metrics = control(
        TrainState.create(still.params, tx, 0, model_state=still.model_state), data
    )
    np.testing.assert_allclose(metrics["grad_norm"], metrics["grad_norm"][0], rtol=1e-5)


def test_dp_epoch_refuses_batch_norm_or_runs_it_frozen(standard_promotion):
    model = from_nnx(DropoutCNN(nnx.Rngs(0, dropout=1), norm="batch"))
    tx = optim.sgd(0.1)
    data = (jax.random.normal(jax.random.key(1), (16, 6, 6, 1)), jnp.arange(16) % 3)
    refused = make_dp_train_epoch(
        cnn_loss(model), 8, clip_norm=1.0, noise_multiplier=1.0, model_state=True
    )
    state = TrainState.create(model.params, tx, 0, model_state=model.model_state)
    with pytest.raises(
        ValueError, match="nnx.BatchNorm layer `norm`.*freeze_model_state=True"
    ) as err:
        refused(state, data)
    # jaxwise's own refusal passes unwrapped: the same one-line message as under dp_gradient
    assert "failed on its first call" not in str(err.value) and "\n" not in str(err.value)
    frozen = make_dp_train_epoch(
        cnn_loss(model),
        8,
        clip_norm=1.0,
        noise_multiplier=1.0,
        model_state=True,
        freeze_model_state=True,
    )
    new, metrics = frozen(state, data)
    assert isinstance(frozen.gradient, DPGradientFn)
    assert frozen.gradient.freeze_model_state and int(new.step) == 2
    np.testing.assert_array_equal(  # the statistics are used, never updated
        np.asarray(new.model_state["norm"]["mean"][...]),
        np.asarray(model.model_state["norm"]["mean"][...]),
    )
    assert int(new.model_state["drop"]["rngs"]["count"][...]) == 2
    with pytest.raises(TypeError, match="`model_state` must be a bool"):
        make_dp_train_epoch(cnn_loss(model), 8, clip_norm=1.0, noise_multiplier=1.0, model_state=1)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_accumulated_stateful_gradient_advances_once_and_equals_one_batch():
    """Micro-batch j's example i folds j·m + i into the keys: the same masks as one batch."""
    x, y = make_problem(n=8)
    state = {"key": jax.random.key(4), "count": jnp.uint32(0)}
    w = jnp.asarray([0.3, -0.2, 0.1])
    whole, whole_norms, whole_state, _ = dp_gradient(
        masked_loss,
        w,
        (x, y),
        jax.random.key(0),
        clip_norm=1.0,
        noise_multiplier=0.0,
        model_state=state,
    )
    micro = jax.tree.map(lambda a: a.reshape(2, 4, *a.shape[1:]), (x, y))
    grads, norms, new_state, _ = jax.jit(
        lambda w, s, m: dp_gradient_accumulated(
            masked_loss,
            w,
            m,
            jax.random.key(0),
            clip_norm=1.0,
            noise_multiplier=0.0,
            expected_batch_size=8.0,
            model_state=s,
        )
    )(w, state, micro)
    np.testing.assert_allclose(np.asarray(norms).reshape(-1), whole_norms, rtol=1e-5)
    np.testing.assert_allclose(grads, whole, rtol=1e-5, atol=1e-7)
    assert int(new_state["count"]) == int(whole_state["count"]) == 1


def test_poisson_steps_run_at_the_smallest_padded_width_that_holds_them():
    """The ladder: same training as one padded width, each step at its bucket, one compile."""
    tx = optim.sgd(0.05)
    x, y = make_problem(n=96)
    results = {}
    for buckets in (1, 4):
        epoch = dp_epoch(
            sq_loss, PoissonSampler(16, buckets=buckets), clip_norm=1.0, noise_multiplier=0.5
        )
        state = TrainState.create(jnp.zeros(3), tx, jax.random.key(3))
        with CompileBudget(1, epoch, exact=True):
            state, metrics = epoch(state, (x, y))
        with CompileBudget(0, epoch, exact=True):  # after warm-up: no compile
            state, more = epoch(state, (x, y))
        results[buckets] = (np.asarray(state.params), metrics, more)
    widths = PoissonSampler(16, buckets=4).widths(96)
    assert len(widths) == 4 and widths[-1] == PoissonSampler(16).width(96) == 65
    for metrics in results[4][1:]:
        sizes, used = np.asarray(metrics["batch_size"]), np.asarray(metrics["width"])
        expected = [min(w for w in widths if w >= s) for s in sizes]
        np.testing.assert_array_equal(used, expected)
    assert "width" not in results[1][1]  # one width: no dispatch
    np.testing.assert_allclose(results[4][0], results[1][0], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="`buckets` must be"):
        PoissonSampler(16, buckets=0)


class Unswitched:
    """Forwards a gradient, but not its ``widths``: the program switches the whole gradient."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def requirements(self):
        return dataclasses.replace(self.inner.requirements, widths=False)

    def init(self, params):
        return self.inner.init(params)

    def __call__(self, params, model_state, batch, state, *, key, mask, context):
        return self.inner(params, model_state, batch, state, key=key, mask=mask, context=context)


class FirstHalf(Unswitched):
    """Forwards ``widths`` but hands on only the first half of the batch: refused by name."""

    @property
    def requirements(self):
        return self.inner.requirements

    def __call__(self, params, model_state, batch, state, *, key, mask, context):
        half = mask.shape[0] // 2
        batch = jax.tree.map(lambda a: a[:half], batch)
        return self.inner(
            params, model_state, batch, state, key=key, mask=mask[:half], context=context
        )


def _noise_draws(jaxpr, in_switch=False):
    """``(outside, inside)``: the ``erf_inv`` (normal draws) outside and inside ``cond``s."""
    out = inside = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "erf_inv":
            inside, out = (inside + 1, out) if in_switch else (inside, out + 1)
        for sub in _sub_jaxprs(eqn.params.values()):
            a, b = _noise_draws(sub, in_switch or eqn.primitive.name == "cond")
            out, inside = out + a, inside + b
    return out, inside


def _sub_jaxprs(values):
    for v in values:
        if isinstance(v, (tuple, list)):
            yield from _sub_jaxprs(v)
        elif hasattr(v, "eqns"):
            yield v
        elif hasattr(v, "jaxpr") and hasattr(v.jaxpr, "eqns"):  # a closed jaxpr
            yield v.jaxpr


def test_a_padded_dp_step_switches_only_its_clipping_and_draws_its_noise_once():
    """Four widths: the DP gradient's clipping runs in the width switch, its noise once after
    it; the same training as the whole gradient switched per width (a wrapper that does not
    forward ``widths``), which draws the noise in every branch."""
    x, y = make_problem(n=96)
    sampler = PoissonSampler(16, buckets=4)
    gradient = dp_gradient_fn(sq_loss, clip_norm=1.0, noise_multiplier=0.5, method="vmap")
    assert gradient.requirements.widths and not Unswitched(gradient).requirements.widths
    runs = {}
    for name, g in (("itself", gradient), ("whole", Unswitched(gradient))):
        state = TrainState.create(jnp.zeros(3), optim.sgd(0.05), 3, gradient=g)
        traced = jax.make_jaxpr(make_epoch(g, sampler).jitted)(state, (x, y))
        runs[name] = _noise_draws(traced.jaxpr)
        epoch = make_epoch(g, sampler)
        with CompileBudget(1, epoch, exact=True):
            state, _ = epoch(state, (x, y))
            state, metrics = epoch(state, (x, y))
        runs[name] += (np.asarray(state.params), metrics)
    assert runs["itself"][:2] == (1, 0)  # one draw, outside the switch
    assert runs["whole"][:2] == (0, 4)  # one per width
    np.testing.assert_allclose(runs["itself"][2], runs["whole"][2], rtol=1e-6, atol=1e-7)
    for name in ("width", "batch_size", "skipped"):
        np.testing.assert_array_equal(runs["itself"][3][name], runs["whole"][3][name])
    np.testing.assert_allclose(
        runs["itself"][3]["grad_norm_mean"], runs["whole"][3]["grad_norm_mean"], rtol=1e-6
    )
    halved = FirstHalf(gradient)
    state = TrainState.create(jnp.zeros(3), optim.sgd(0.05), 3, gradient=halved)
    with pytest.raises(ValueError, match=r"whole padded batch \(65 rows.*got 32.*widths=False"):
        make_epoch(halved, sampler)(state, (x, y))


def test_ladder_widths_come_from_the_binomial_distribution_of_the_batch_size():
    """plan_buckets over equally likely binomial quantiles; the overflow tail in float64."""
    from scipy import stats

    sampler = PoissonSampler(64)
    widths = sampler.widths(1437)
    assert widths == (60, 67, 74, 85, 161) and widths[-1] == sampler.width(1437) == 64 + 12 * 8 + 1
    sizes = np.arange(0, 162)
    pmf = stats.binom.pmf(sizes, 1437, 64 / 1437)
    bucket = np.asarray([min(w for w in widths if w >= s) for s in sizes])
    assert (pmf * bucket).sum() / 64 < 1.07  # expected rows per step: 1.066 batches, not 2.5
    assert (pmf * 161).sum() / 64 > 2.5
    assert sampler.overflow_probability(1437) == pytest.approx(
        stats.binom.sf(161, 1437, 64 / 1437), rel=1e-6
    )
    assert sampler.overflow_probability(1437) < 1e-25
    assert PoissonSampler(4, multiple=4).widths(96) == (4, 8, 12, 32)  # multiples of the mesh
    assert (
        PoissonSampler(96).widths(96) == (96,) and PoissonSampler(96).overflow_probability(96) == 0
    )

"""Every bad call at the library boundary gets a clear answer (issue #16, library part).

One table of bad calls across the public modules that ``tests/test_bad_input.py`` does not
cover (optim, models, train, per_example, privacy, label_errors, compilation, buckets, tree,
data, diagnose). Each row is ``(id, call, expected exception type, substring)``: the call
must raise that type (``TypeError``/``ValueError`` or a documented subclass), the message
must contain the substring (the argument's name), and the error must be raised by jaxwise's
own code — an error that merely escapes from deep inside JAX, NumPy, Optax, dp-accounting or
orbax does not count, however it is worded. A second, smaller table checks that finite input
gives finite output where that is promised.

Every row of the first table passes bad input on purpose: the lines a type checker rejects
for it carry ``# pyright: ignore[...]`` with the rule.
"""

from __future__ import annotations

import math
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxwise.train
from jaxwise import (
    buckets,
    checkpoint,
    compilation,
    data,
    diagnose,
    label_errors,
    models,
    optim,
    privacy,
    sharding,
    train,
    tree,
)
from jaxwise import per_example as pe

NAN = float("nan")
INF = float("inf")
KEY = jax.random.key(0)
P = {"w": jnp.ones((3,)), "b": jnp.zeros(())}
X = jnp.ones((4, 3))
Y = jnp.zeros((4,), jnp.int32)
MLP = models.init_mlp(0, (3, 4, 2))


def loss_single(params: Any, example: tuple[jax.Array, jax.Array]) -> jax.Array:
    """Squared error of a linear model on ONE example ``(x, y)``."""
    x, _ = example
    return (x @ params["w"] + params["b"]) ** 2


def loss_batch(params: Any, batch: Any) -> jax.Array:
    """Mean of ``loss_single`` over a batch ``(x, y)``."""
    return jnp.mean(jax.vmap(loss_single, (None, 0))(params, batch))


def _state() -> train.TrainState:
    return train.TrainState.create(P, optim.sgd(0.1), KEY)


def _jitted() -> Any:
    return jax.jit(lambda x: x + 1)


Row = tuple[str, Callable[[], Any], type[Exception], str]

OPTIM: list[Row] = [
    ("sgd-lr-str", lambda: optim.sgd("0.1"), TypeError, "learning_rate"),  # pyright: ignore[reportArgumentType]
    ("sgd-lr-none", lambda: optim.sgd(None), ValueError, "learning_rate"),  # pyright: ignore[reportArgumentType]
    ("sgd-lr-nan", lambda: optim.sgd(NAN), ValueError, "learning_rate"),
    ("sgd-lr-inf", lambda: optim.sgd(INF), ValueError, "learning_rate"),
    ("sgd-lr-neg", lambda: optim.sgd(-0.1), ValueError, "learning_rate"),
    ("sgd-lr-bool", lambda: optim.sgd(True), TypeError, "learning_rate"),
    ("sgd-lr-list", lambda: optim.sgd([0.1]), TypeError, "learning_rate"),  # pyright: ignore[reportArgumentType]
    ("sgd-lr-np-neg", lambda: optim.sgd(np.float32(-1.0)), ValueError, "learning_rate"),
    ("adam-lr-jax-nan", lambda: optim.adam(jnp.asarray(NAN)), ValueError, "learning_rate"),
    ("adam-lr-jax-vector", lambda: optim.adam(jnp.ones(2)), TypeError, "learning_rate"),
    ("clip-jax-inf", lambda: optim.clip_by_global_norm(jnp.inf), ValueError, "max_norm"),
    (
        "linear-np-neg",
        lambda: optim.linear_schedule(1.0, 0.0, np.int64(-1)),
        ValueError,
        "transition_steps",
    ),
    ("sgd-momentum-1", lambda: optim.sgd(0.1, momentum=1.0), ValueError, "momentum"),
    ("sgd-momentum-neg", lambda: optim.sgd(0.1, momentum=-0.1), ValueError, "momentum"),
    ("sgd-momentum-nan", lambda: optim.sgd(0.1, momentum=NAN), ValueError, "momentum"),
    ("sgd-nesterov-str", lambda: optim.sgd(0.1, nesterov="yes"), TypeError, "nesterov"),  # pyright: ignore[reportArgumentType]
    (
        "sgd-acc-dtype",
        lambda: optim.sgd(0.1, 0.9, accumulator_dtype="nope"),
        TypeError,
        "accumulator_dtype",
    ),
    ("adam-lr-nan", lambda: optim.adam(NAN), ValueError, "learning_rate"),
    ("adam-b1-one", lambda: optim.adam(1e-3, b1=1.0), ValueError, "b1"),
    ("adam-b1-neg", lambda: optim.adam(1e-3, b1=-0.5), ValueError, "b1"),
    ("adam-b2-nan", lambda: optim.adam(1e-3, b2=NAN), ValueError, "b2"),
    ("adam-b2-big", lambda: optim.adam(1e-3, b2=1.5), ValueError, "b2"),
    ("adam-eps-neg", lambda: optim.adam(1e-3, eps=-1e-8), ValueError, "eps"),
    ("adam-eps-nan", lambda: optim.adam(1e-3, eps=NAN), ValueError, "eps"),
    ("adam-eps-root-neg", lambda: optim.adam(1e-3, eps_root=-1.0), ValueError, "eps_root"),
    ("adam-mu-dtype", lambda: optim.adam(1e-3, mu_dtype="bogus"), TypeError, "mu_dtype"),
    ("adam-nesterov-int", lambda: optim.adam(1e-3, nesterov=1), TypeError, "nesterov"),  # pyright: ignore[reportArgumentType]
    ("adamw-wd-neg", lambda: optim.adamw(1e-3, weight_decay=-1.0), ValueError, "weight_decay"),
    ("adamw-wd-nan", lambda: optim.adamw(1e-3, weight_decay=NAN), ValueError, "weight_decay"),
    ("adamw-mask-regex", lambda: optim.adamw(1e-3, mask="(w"), ValueError, "mask"),
    ("adamw-mask-int", lambda: optim.adamw(1e-3, mask=3).init(P), TypeError, "mask"),
    ("lion-b1-big", lambda: optim.lion(1e-4, b1=2.0), ValueError, "b1"),
    ("lion-wd-str", lambda: optim.lion(1e-4, weight_decay="x"), TypeError, "weight_decay"),  # pyright: ignore[reportArgumentType]
    ("lion-lr-inf", lambda: optim.lion(INF), ValueError, "learning_rate"),
    ("scale-str", lambda: optim.scale("a"), TypeError, "step_size"),  # pyright: ignore[reportArgumentType]
    ("scale-nan", lambda: optim.scale(NAN), ValueError, "step_size"),
    ("scale-by-lr-nan", lambda: optim.scale_by_learning_rate(NAN), ValueError, "learning_rate"),
    (
        "scale-by-lr-flip",
        lambda: optim.scale_by_learning_rate(0.1, flip_sign="no"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "flip_sign",
    ),
    ("scale-by-schedule-float", lambda: optim.scale_by_schedule(3.0), TypeError, "step_size_fn"),  # pyright: ignore[reportArgumentType]
    ("trace-decay-one", lambda: optim.trace(1.0), ValueError, "decay"),
    ("trace-decay-nan", lambda: optim.trace(NAN), ValueError, "decay"),
    ("scale-by-adam-b1-nan", lambda: optim.scale_by_adam(b1=NAN), ValueError, "b1"),
    ("scale-by-lion-mode", lambda: optim.scale_by_lion(mode="soft"), ValueError, "mode"),  # pyright: ignore[reportArgumentType]
    (
        "scale-by-lion-beta",
        lambda: optim.scale_by_lion(mode="smooth", smooth_beta=0.0),
        ValueError,
        "smooth_beta",
    ),
    ("decay-neg", lambda: optim.add_decayed_weights(-1.0), ValueError, "weight_decay"),
    ("decay-mask-regex", lambda: optim.add_decayed_weights(0.1, mask="["), ValueError, "mask"),
    (
        "decay-mask-fn-int",
        lambda: optim.add_decayed_weights(0.1, mask=lambda p: 3).init(P),
        TypeError,
        "mask",
    ),
    (
        "decay-mask-structure",
        lambda: optim.add_decayed_weights(0.1, mask={"v": True}).init(P),
        ValueError,
        "mask",
    ),
    ("clip-zero", lambda: optim.clip_by_global_norm(0.0), ValueError, "max_norm"),
    ("clip-neg", lambda: optim.clip_by_global_norm(-1.0), ValueError, "max_norm"),
    ("clip-nan", lambda: optim.clip_by_global_norm(NAN), ValueError, "max_norm"),
    ("clip-str", lambda: optim.clip_by_global_norm("1"), TypeError, "max_norm"),  # pyright: ignore[reportArgumentType]
    ("freeze-none", lambda: optim.freeze(None), ValueError, "mask"),  # pyright: ignore[reportArgumentType]
    ("freeze-regex", lambda: optim.freeze("(w"), ValueError, "mask"),
    ("freeze-structure", lambda: optim.freeze({"x": True}).init(P), ValueError, "mask"),
    ("freeze-leaf-int", lambda: optim.freeze({"w": 1, "b": 0}).init(P), TypeError, "mask"),
    ("chain-int", lambda: optim.chain(optim.sgd(0.1), 3), TypeError, "chain argument 1"),  # pyright: ignore[reportArgumentType]
    ("apply-structure", lambda: optim.apply_updates(P, {"w": jnp.ones(3)}), ValueError, "updates"),
    ("apply-none", lambda: optim.apply_updates(P, None), ValueError, "updates"),  # pyright: ignore[reportArgumentType]
    ("apply-params-none", lambda: optim.apply_updates(None, P), ValueError, "updates"),  # pyright: ignore[reportArgumentType]
    ("apply-leaf-str", lambda: optim.apply_updates({"w": "a"}, {"w": "b"}), TypeError, "params"),  # pyright: ignore[reportArgumentType]
    (
        "apply-update-leaf-str",
        lambda: optim.apply_updates(P, {"w": "a", "b": "b"}),  # pyright: ignore[reportArgumentType]
        TypeError,
        "updates",
    ),
    ("apply-str", lambda: optim.apply_updates(P, "x"), ValueError, "updates"),  # pyright: ignore[reportArgumentType]
    (
        "apply-shape",
        lambda: optim.apply_updates(P, {"w": jnp.ones(4), "b": jnp.zeros(())}),
        ValueError,
        "updates",
    ),
    ("global-norm-str", lambda: optim.global_norm("abc"), TypeError, "updates"),  # pyright: ignore[reportArgumentType]
    (
        "update-needs-params",
        lambda: optim.add_decayed_weights(0.1).update(P, optim.add_decayed_weights(0.1).init(P)),
        ValueError,
        "params",
    ),
]

SCHEDULES: list[Row] = [
    ("const-nan", lambda: optim.constant_schedule(NAN), ValueError, "value"),
    ("const-str", lambda: optim.constant_schedule("1"), TypeError, "value"),  # pyright: ignore[reportArgumentType]
    (
        "linear-steps-neg",
        lambda: optim.linear_schedule(1.0, 0.0, -1),
        ValueError,
        "transition_steps",
    ),
    (
        "linear-steps-float",
        lambda: optim.linear_schedule(1.0, 0.0, 1.5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "transition_steps",
    ),
    ("linear-init-nan", lambda: optim.linear_schedule(NAN, 0.0, 10), ValueError, "init_value"),
    ("linear-end-inf", lambda: optim.linear_schedule(1.0, INF, 10), ValueError, "end_value"),
    (
        "linear-begin-neg",
        lambda: optim.linear_schedule(1.0, 0.0, 10, -1),
        ValueError,
        "transition_begin",
    ),
    ("cosine-steps-zero", lambda: optim.cosine_decay_schedule(1.0, 0), ValueError, "decay_steps"),
    (
        "cosine-alpha-neg",
        lambda: optim.cosine_decay_schedule(1.0, 10, alpha=-1.0),
        ValueError,
        "alpha",
    ),
    ("cosine-init-str", lambda: optim.cosine_decay_schedule("1", 10), TypeError, "init_value"),  # pyright: ignore[reportArgumentType]
    (
        "cosine-exponent-nan",
        lambda: optim.cosine_decay_schedule(1.0, 10, exponent=NAN),
        ValueError,
        "exponent",
    ),
    (
        "warmup-order",
        lambda: optim.warmup_cosine_decay_schedule(0.0, 1.0, 10, 5),
        ValueError,
        "warmup_steps",
    ),
    (
        "warmup-neg",
        lambda: optim.warmup_cosine_decay_schedule(0.0, 1.0, -1, 5),
        ValueError,
        "warmup_steps",
    ),
    (
        "warmup-peak-inf",
        lambda: optim.warmup_cosine_decay_schedule(0.0, INF, 1, 5),
        ValueError,
        "peak_value",
    ),
    (
        "piecewise-list",
        lambda: optim.piecewise_constant_schedule(1.0, [1, 2]),  # pyright: ignore[reportArgumentType]
        TypeError,
        "boundaries_and_scales",
    ),
    (
        "piecewise-neg-key",
        lambda: optim.piecewise_constant_schedule(1.0, {-1: 0.1}),
        ValueError,
        "boundaries_and_scales",
    ),
    (
        "piecewise-nan-scale",
        lambda: optim.piecewise_constant_schedule(1.0, {10: NAN}),
        ValueError,
        "boundaries_and_scales",
    ),
    (
        "join-length",
        lambda: optim.join_schedules([optim.constant_schedule(1.0)], [5]),
        ValueError,
        "schedules",
    ),
    (
        "join-neg",
        lambda: optim.join_schedules([optim.constant_schedule(1.0)] * 2, [-1]),
        ValueError,
        "boundaries",
    ),
    (
        "join-not-callable",
        lambda: optim.join_schedules([optim.constant_schedule(1.0), 3], [5]),  # pyright: ignore[reportArgumentType]
        TypeError,
        "schedules[1]",
    ),
    (
        "join-decreasing",
        lambda: optim.join_schedules([optim.constant_schedule(1.0)] * 3, [10, 5]),
        ValueError,
        "boundaries",
    ),
]


class _NotAModel:
    pass


MODELS: list[Row] = [
    ("mlp-sizes-short", lambda: models.init_mlp(0, (2,)), ValueError, "sizes"),
    ("mlp-sizes-zero", lambda: models.init_mlp(0, (2, 0)), ValueError, "sizes"),
    ("mlp-sizes-neg", lambda: models.init_mlp(0, (2, -1)), ValueError, "sizes"),
    ("mlp-sizes-float", lambda: models.init_mlp(0, (2, 3.0)), ValueError, "sizes"),  # pyright: ignore[reportArgumentType]
    ("mlp-sizes-int", lambda: models.init_mlp(0, 5), TypeError, "sizes"),  # pyright: ignore[reportArgumentType]
    ("mlp-sizes-none", lambda: models.init_mlp(0, None), TypeError, "sizes"),  # pyright: ignore[reportArgumentType]
    ("mlp-key-str", lambda: models.init_mlp("seed", (2, 3)), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    ("mlp-key-none", lambda: models.init_mlp(None, (2, 3)), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    ("mlp-key-bool", lambda: models.init_mlp(True, (2, 3)), TypeError, "key"),
    ("mlp-dtype-bogus", lambda: models.init_mlp(0, (2, 3), dtype="bogus"), TypeError, "dtype"),
    ("mlp-dtype-int", lambda: models.init_mlp(0, (2, 3), dtype=jnp.int32), TypeError, "dtype"),
    ("apply-x-str", lambda: models.mlp_apply(MLP, "x"), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("apply-x-none", lambda: models.mlp_apply(MLP, None), TypeError, "x"),  # pyright: ignore[reportArgumentType]
    ("apply-x-scalar", lambda: models.mlp_apply(MLP, jnp.ones(())), ValueError, "x"),
    ("apply-x-features", lambda: models.mlp_apply(MLP, jnp.ones((5, 2))), ValueError, "x"),
    ("apply-params-str", lambda: models.mlp_apply("params", X), TypeError, "params"),  # pyright: ignore[reportArgumentType]
    (
        "apply-params-names",
        lambda: models.mlp_apply({"a": MLP["dense_0"]}, X),
        ValueError,
        "params",
    ),
    ("apply-params-empty", lambda: models.mlp_apply({}, X), ValueError, "params"),
    ("from-nnx-object", lambda: models.from_nnx(_NotAModel()), TypeError, "module"),  # pyright: ignore[reportArgumentType]
    ("from-nnx-int", lambda: models.from_nnx(3), TypeError, "module"),  # pyright: ignore[reportArgumentType]
    ("from-linen-object", lambda: models.from_linen(_NotAModel(), {}), TypeError, "module"),  # pyright: ignore[reportArgumentType]
    ("from-equinox-int", lambda: models.from_equinox(3), TypeError, "module"),  # pyright: ignore[reportArgumentType]
    ("from-equinox-dict", lambda: models.from_equinox({"w": jnp.ones(2)}), TypeError, "module"),  # pyright: ignore[reportArgumentType]
]


def _linen_dense() -> Any:
    import flax.linen as nn

    return nn.Dense(2)


def _nnx_linear() -> Any:
    from flax import nnx

    return nnx.Linear(3, 2, rngs=nnx.Rngs(0))


def _eqx_linear() -> Any:
    import equinox as eqx

    return eqx.nn.Linear(3, 2, key=KEY)


MODELS += [
    ("from-nnx-linen", lambda: models.from_nnx(_linen_dense()), TypeError, "module"),
    ("from-nnx-tuple", lambda: models.from_nnx((_nnx_linear(), {})), TypeError, "module"),  # pyright: ignore[reportArgumentType]
    ("from-linen-nnx", lambda: models.from_linen(_nnx_linear(), {}), TypeError, "module"),
    ("from-equinox-nnx", lambda: models.from_equinox(_nnx_linear()), TypeError, "module"),
    (
        "from-equinox-state",
        lambda: models.from_equinox(_eqx_linear(), state="s"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "state",
    ),
    (
        "nnx-apply-state",
        lambda: (lambda m: m.apply(m.params, {"s": 1}, X))(models.from_nnx(_nnx_linear())),
        ValueError,
        "model_state",
    ),
    (
        "from-linen-vars-str",
        lambda: models.from_linen(_linen_dense(), "vars"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "variables",
    ),
    (
        "from-linen-vars-none",
        lambda: models.from_linen(_linen_dense(), None),  # pyright: ignore[reportArgumentType]
        TypeError,
        "variables",
    ),
]

TRAIN: list[Row] = [
    (
        "create-params-str",
        lambda: train.TrainState.create("p", optim.sgd(0.1), KEY),  # pyright: ignore[reportArgumentType]
        TypeError,
        "params",
    ),
    (
        "create-params-empty",
        lambda: train.TrainState.create({}, optim.sgd(0.1), KEY),
        ValueError,
        "params",
    ),
    (
        "create-params-int",
        lambda: train.TrainState.create({"w": jnp.ones(2, jnp.int32)}, optim.sgd(0.1), KEY),
        TypeError,
        "params",
    ),
    (
        "create-params-leaf-str",
        lambda: train.TrainState.create({"w": "a"}, optim.sgd(0.1), KEY),  # pyright: ignore[reportArgumentType]
        TypeError,
        "params",
    ),
    (
        "create-params-none",
        lambda: train.TrainState.create(None, optim.sgd(0.1), KEY),  # pyright: ignore[reportArgumentType]
        TypeError,
        "params",
    ),
    (
        "create-optimizer-str",
        lambda: train.TrainState.create(P, "adam", KEY),  # pyright: ignore[reportArgumentType]
        TypeError,
        "optimizer",
    ),
    (
        "create-optimizer-none",
        lambda: train.TrainState.create(P, None, KEY),  # pyright: ignore[reportArgumentType]
        TypeError,
        "optimizer",
    ),
    ("create-key-str", lambda: train.TrainState.create(P, optim.sgd(0.1), "k"), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    ("create-key-float", lambda: train.TrainState.create(P, optim.sgd(0.1), 1.5), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    (
        "create-key-batch",
        lambda: train.TrainState.create(P, optim.sgd(0.1), jax.random.split(KEY, 2)),
        ValueError,
        "key",
    ),
    (
        "create-model-state-str",
        lambda: train.TrainState.create(P, optim.sgd(0.1), KEY, model_state={"s": "x"}),
        TypeError,
        "model_state",
    ),
    (
        "create-static-unhashable",
        lambda: train.TrainState.create(P, optim.sgd(0.1), KEY, tag=[1]),
        TypeError,
        "tag",
    ),
    ("step-loss-str", lambda: train.make_train_step("loss"), TypeError, "`loss`"),  # pyright: ignore[reportArgumentType]
    (
        "step-gradient-none",
        lambda: train.make_step(None),  # pyright: ignore[reportArgumentType]
        TypeError,
        "gradient",
    ),
    (
        "step-mesh-str",
        lambda: train.make_train_step(loss_batch, mesh="m"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "mesh",
    ),
    (
        "step-compute-dtype",
        lambda: jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_batch), compute_dtype="bogus"
            )
        ),
        TypeError,
        "compute_dtype",
    ),
    (
        "step-compute-dtype-int",
        lambda: jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_batch), compute_dtype=jnp.int32
            )
        ),
        TypeError,
        "compute_dtype",
    ),
    (
        "step-loss-scale-str",
        lambda: jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_batch),
                compute_dtype=jnp.float32,
                loss_scale="static",
            )
        ),  # pyright: ignore[reportArgumentType]
        ValueError,
        "loss_scale",
    ),
    (
        "step-loss-scale-neg",
        lambda: jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_batch), compute_dtype=jnp.float32, loss_scale=-1.0
            )
        ),
        ValueError,
        "loss_scale",
    ),
    (
        "step-loss-scale-nan",
        lambda: jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_batch), compute_dtype=jnp.float32, loss_scale=NAN
            )
        ),
        ValueError,
        "loss_scale",
    ),
    (
        "epoch-bs-zero",
        lambda: train.make_train_epoch(loss_batch, 0),
        ValueError,
        "batch_size",
    ),
    (
        "epoch-bs-neg",
        lambda: train.make_train_epoch(loss_batch, -4),
        ValueError,
        "batch_size",
    ),
    (
        "epoch-bs-float",
        lambda: train.make_train_epoch(loss_batch, 2.5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "batch_size",
    ),
    (
        "epoch-bs-str",
        lambda: train.make_train_epoch(loss_batch, "8"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "batch_size",
    ),
    (
        "epoch-bs-bool",
        lambda: train.make_train_epoch(loss_batch, True),
        TypeError,
        "batch_size",
    ),
    (
        "epoch-mesh-int",
        lambda: train.make_train_epoch(loss_batch, 2, mesh=3),  # pyright: ignore[reportArgumentType]
        TypeError,
        "mesh",
    ),
    (
        "epoch-loss-none",
        lambda: train.make_train_epoch(None, 2),  # pyright: ignore[reportArgumentType]
        TypeError,
        "`loss`",
    ),
    (
        "epoch-data-mismatch",
        lambda: train.make_train_epoch(loss_batch, 2)(_state(), (X, Y[:3])),
        ValueError,
        "data",
    ),
    (
        "epoch-data-small",
        lambda: train.make_train_epoch(loss_batch, 8)(_state(), (X, Y)),
        ValueError,
        "batch_size",
    ),
    (
        "step-state-str",
        lambda: train.make_train_step(loss_batch)("s", (X, Y)),  # pyright: ignore[reportArgumentType]
        TypeError,
        "state",
    ),
    (
        "step-optimizer-mismatch",
        lambda: train.make_train_step(loss_batch)(_state().replace(tx=optim.adam(0.1)), (X, Y)),
        ValueError,
        "opt",
    ),
    ("donatable-deleted", lambda: train.check_donatable(_deleted_tree()), ValueError, "w"),
    ("save-tree-str", lambda: checkpoint.save(_tmp() / "ck", "state"), TypeError, "tree"),  # pyright: ignore[reportArgumentType]
    (
        "save-keep-zero",
        lambda: checkpoint.save(_tmp() / "ck", _state(), keep=0),
        ValueError,
        "keep",
    ),
    (
        "save-metadata-obj",
        lambda: checkpoint.save(_tmp() / "ck", _state(), {"x": object()}),
        TypeError,
        "metadata",
    ),
    ("restore-like-str", lambda: checkpoint.restore(_tmp() / "ck", "like"), TypeError, "like"),  # pyright: ignore[reportArgumentType]
    (
        "restore-step-neg",
        lambda: checkpoint.restore(_tmp() / "ck", _state(), step=-1),
        ValueError,
        "step",
    ),
    (
        "restore-step-str",
        lambda: checkpoint.restore(_tmp() / "ck", _state(), step="1"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "step",
    ),
    (
        "checkpointer-keep",
        lambda: checkpoint.Checkpointer(_tmp() / "ck", keep=0),
        ValueError,
        "keep",
    ),
    ("fsdp-zero", lambda: sharding.fsdp_mesh(0), ValueError, "model"),
    ("fsdp-divide", lambda: sharding.fsdp_mesh(3), ValueError, "model"),
    ("fsdp-float", lambda: sharding.fsdp_mesh(2.0), TypeError, "model"),  # pyright: ignore[reportArgumentType]
    ("fit-state-str", lambda: train.fit(lambda s, b: (s, {}), "state", []), TypeError, "state"),  # pyright: ignore[reportArgumentType]
    (
        "fit-steps-zero",
        lambda: train.fit(lambda s, b: (s, {}), _state(), [], steps=0),
        ValueError,
        "steps",
    ),
    ("fit-program-str", lambda: train.fit("step", _state(), []), TypeError, "program"),  # pyright: ignore[reportArgumentType]
    (
        "fit-checkpointing-every-zero",
        lambda: train.Checkpointing(types.SimpleNamespace(save=print), every=0),  # pyright: ignore[reportArgumentType]
        ValueError,
        "every",
    ),
    (
        "loss-scale-nan",
        lambda: train.DynamicLossScale(initial_scale=NAN),
        ValueError,
        "initial_scale",
    ),
    (
        "loss-scale-interval",
        lambda: train.DynamicLossScale(growth_interval=0),
        ValueError,
        "growth_interval",
    ),
    ("loss-scale-factor", lambda: train.DynamicLossScale(factor=1.0), ValueError, "factor"),
    (
        "step-donate-str",
        lambda: train.make_train_step(loss_batch, donate="y"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "donate",
    ),
    (
        "step-audit-int",
        lambda: train.make_step(train.value_and_grad(loss_batch), audit=2),  # pyright: ignore[reportArgumentType]
        TypeError,
        "audit",
    ),
    (
        "step-has-aux-str",
        lambda: train.make_train_step(loss_batch, has_aux="no"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "has_aux",
    ),
    (
        "step-model-state-str",
        lambda: train.make_train_step(loss_batch, model_state="no"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "model_state",
    ),
    (
        "save-metadata-list",
        lambda: checkpoint.save(_tmp() / "ck", _state(), [1, 2]),  # pyright: ignore[reportArgumentType]
        TypeError,
        "metadata",
    ),
    ("save-path-none", lambda: checkpoint.save(None, _state()), TypeError, "path"),  # pyright: ignore[reportArgumentType]
    ("restore-path-none", lambda: checkpoint.restore(None, _state()), TypeError, "path"),  # pyright: ignore[reportArgumentType]
    ("latest-step-none", lambda: checkpoint.latest_step(None), TypeError, "path"),  # pyright: ignore[reportArgumentType]
    ("data-mesh-str", lambda: sharding.data_mesh("cpu"), TypeError, "devices"),
    ("data-mesh-empty", lambda: sharding.data_mesh([]), ValueError, "devices"),
    ("shardings-mesh-str", lambda: sharding.state_shardings(_state(), "mesh"), TypeError, "mesh"),  # pyright: ignore[reportArgumentType]
    (
        "shardings-min-size",
        lambda: sharding.state_shardings(
            _state(), sharding.fsdp_mesh(2, jax.devices("cpu")), min_size=-1
        ),
        ValueError,
        "min_size",
    ),
    ("shuffle-sampler-bs", lambda: train.ShuffleSampler(0), ValueError, "batch_size"),
    (
        "step-with-key-str",
        lambda: train.make_train_step(loss_batch, with_key="y"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "with_key",
    ),
    (
        "epoch-donate-str",
        lambda: train.make_train_epoch(loss_batch, 2, donate="y"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "donate",
    ),
    (
        "epoch-has-aux-int",
        lambda: train.make_train_epoch(loss_batch, 2, has_aux=1),  # pyright: ignore[reportArgumentType]
        TypeError,
        "has_aux",
    ),
    ("load-metadata-none", lambda: checkpoint.load_metadata(None), TypeError, "path"),  # pyright: ignore[reportArgumentType]
]

_TMP: list[Path] = []


def _tmp() -> Path:
    return _TMP[0]


def _deleted_tree() -> Any:
    w = jnp.ones(3) + 1
    w.delete()
    return {"w": w}


PREFETCH: list[Row] = [
    ("prefetch-size-zero", lambda: data.prefetch_to_device([X], size=0), ValueError, "size"),
    ("prefetch-size-str", lambda: data.prefetch_to_device([X], size="2"), TypeError, "size"),  # pyright: ignore[reportArgumentType]
    ("prefetch-iter-none", lambda: data.prefetch_to_device(None), TypeError, "iterator"),  # pyright: ignore[reportArgumentType]
    ("prefetch-iter-int", lambda: data.prefetch_to_device(3), TypeError, "iterator"),  # pyright: ignore[reportArgumentType]
    ("prefetch-mesh-str", lambda: data.prefetch_to_device([X], mesh="m"), TypeError, "mesh"),  # pyright: ignore[reportArgumentType]
]

PER_EXAMPLE: list[Row] = [
    ("grads-loss-str", lambda: pe.per_example_grads("loss", P, (X, Y)), TypeError, "loss"),  # pyright: ignore[reportArgumentType]
    ("grads-no-batch", lambda: pe.per_example_grads(loss_single, P, ()), ValueError, "batch"),
    (
        "grads-batch-mismatch",
        lambda: pe.per_example_grads(loss_single, P, (X, Y[:3])),
        ValueError,
        "batch",
    ),
    (
        "grads-batch-scalar",
        lambda: pe.per_example_grads(loss_single, P, (jnp.ones(()), Y)),
        ValueError,
        "batch",
    ),
    (
        "norms-chunk-zero",
        lambda: pe.per_example_grad_norms(loss_single, P, (X, Y), chunk_size=0),
        ValueError,
        "chunk_size",
    ),
    (
        "norms-chunk-neg",
        lambda: pe.per_example_grad_norms(loss_single, P, (X, Y), chunk_size=-2),
        ValueError,
        "chunk_size",
    ),
    (
        "norms-chunk-float",
        lambda: pe.per_example_grad_norms(loss_single, P, (X, Y), chunk_size=2.5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "chunk_size",
    ),
    (
        "norms-chunk-str",
        lambda: pe.per_example_grad_norms(loss_single, P, (X, Y), chunk_size="big"),  # pyright: ignore[reportArgumentType]
        ValueError,
        "chunk_size",
    ),
    (
        "norms-method",
        lambda: pe.per_example_grad_norms(loss_single, P, (X, Y), method="fast"),  # pyright: ignore[reportArgumentType]
        ValueError,
        "method",
    ),
    (
        "norms-budget-zero",
        lambda: pe.per_example_grad_norms(loss_single, P, (X, Y), memory_budget=0),
        ValueError,
        "memory_budget",
    ),
    (
        "norms-params-str",
        lambda: pe.per_example_grad_norms(loss_single, "p", (X, Y)),
        TypeError,
        "params",
    ),
    ("norms-loss-none", lambda: pe.per_example_grad_norms(None, P, (X, Y)), TypeError, "loss"),  # pyright: ignore[reportArgumentType]
    (
        "clip-zero",
        lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm=0.0),
        ValueError,
        "clip_norm",
    ),
    (
        "clip-neg",
        lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm=-1.0),
        ValueError,
        "clip_norm",
    ),
    (
        "clip-nan",
        lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm=NAN),
        ValueError,
        "clip_norm",
    ),
    (
        "clip-weights-shape",
        lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm=1.0, weights=jnp.ones(3)),
        ValueError,
        "weights",
    ),
    (
        "hardest-k-zero",
        lambda: label_errors.hardest_examples(loss_single, P, (X, Y), k=0),
        ValueError,
        "k",
    ),
    (
        "hardest-k-big",
        lambda: label_errors.hardest_examples(loss_single, P, (X, Y), k=5),
        ValueError,
        "k",
    ),
    (
        "hardest-k-float",
        lambda: label_errors.hardest_examples(loss_single, P, (X, Y), k=2.5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "k",
    ),
    (
        "hardest-k-str",
        lambda: label_errors.hardest_examples(loss_single, P, (X, Y), k="3"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "k",
    ),
    (
        "gradnorm-no-params",
        lambda: label_errors.find_label_errors(
            X, Y, scoring=label_errors.Scoring(method="gradnorm")
        ),
        TypeError,
        "params",
    ),
    (
        "gradnorm-int-params",
        lambda: label_errors.find_label_errors(
            X,
            Y,
            model=label_errors.MLP(params={"w": jnp.ones(2, jnp.int32)}),
            scoring=label_errors.Scoring(method="gradnorm"),
        ),
        TypeError,
        "params",
    ),
    ("coverage-no-example", lambda: pe.ghost_coverage(loss_single, P, ()), ValueError, "example"),
    ("mlp-loss-int", lambda: models.mlp_loss(3), TypeError, "loss_from_logits"),  # pyright: ignore[reportArgumentType]
    (
        "auto-chunk-budget",
        lambda: pe.auto_chunk_size(loss_single, P, (X, Y), memory_budget=0),
        ValueError,
        "memory_budget",
    ),
    ("grads-batch-str", lambda: pe.per_example_grads(loss_single, P, ("x", Y)), TypeError, "batch"),
    ("grads-batch-none", lambda: pe.per_example_grads(loss_single, P, None), ValueError, "batch"),
    (
        "grads-batch-empty",
        lambda: pe.per_example_grads(loss_single, P, (X[:0], Y[:0])),
        ValueError,
        "batch",
    ),
    (
        "grads-params-str",
        lambda: pe.per_example_grads(loss_single, "p", (X, Y)),
        TypeError,
        "params",
    ),
    (
        "norms-params-none",
        lambda: pe.per_example_grad_norms(loss_single, None, (X, Y)),
        TypeError,
        "params",
    ),
    (
        "norms-batch-empty",
        lambda: pe.per_example_grad_norms(loss_single, P, (X[:0], Y[:0])),
        ValueError,
        "batch",
    ),
    (
        "clip-str",
        lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm="1"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "clip_norm",
    ),
    (
        "clip-none",
        lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm=None),  # pyright: ignore[reportArgumentType]
        TypeError,
        "clip_norm",
    ),
    (
        "clip-weights-str",
        lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm=1.0, weights="w"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "weights",
    ),
    (
        "clip-batch-empty",
        lambda: pe.clip_and_sum(loss_single, P, (X[:0], Y[:0]), clip_norm=1.0),
        ValueError,
        "batch",
    ),
]

PRIVACY: list[Row] = [
    (
        "noise-nm-nan",
        lambda: privacy.add_dp_noise(P, KEY, 1.0, NAN, 4),
        ValueError,
        "noise_multiplier",
    ),
    (
        "noise-nm-neg",
        lambda: privacy.add_dp_noise(P, KEY, 1.0, -1.0, 4),
        ValueError,
        "noise_multiplier",
    ),
    (
        "noise-nm-inf",
        lambda: privacy.add_dp_noise(P, KEY, 1.0, INF, 4),
        ValueError,
        "noise_multiplier",
    ),
    (
        "noise-nm-str",
        lambda: privacy.add_dp_noise(P, KEY, 1.0, "1", 4),  # pyright: ignore[reportArgumentType]
        TypeError,
        "noise_multiplier",
    ),
    (
        "noise-nm-none",
        lambda: privacy.add_dp_noise(P, KEY, 1.0, None, 4),  # pyright: ignore[reportArgumentType]
        TypeError,
        "noise_multiplier",
    ),
    ("noise-clip-nan", lambda: privacy.add_dp_noise(P, KEY, NAN, 1.0, 4), ValueError, "clip_norm"),
    ("noise-clip-zero", lambda: privacy.add_dp_noise(P, KEY, 0.0, 1.0, 4), ValueError, "clip_norm"),
    ("noise-key-str", lambda: privacy.add_dp_noise(P, "k", 1.0, 1.0, 4), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    (
        "dpg-batch-dict-mismatch",
        lambda: privacy.dp_gradient(
            loss_single, P, {"x": X, "y": Y[:3]}, KEY, clip_norm=1.0, noise_multiplier=1.0
        ),
        ValueError,
        "batch",
    ),
    (
        "dpg-batch-scalar",
        lambda: privacy.dp_gradient(
            loss_single, P, jnp.ones(()), KEY, clip_norm=1.0, noise_multiplier=1.0
        ),
        ValueError,
        "batch",
    ),
    (
        "dpg-key-str",
        lambda: privacy.dp_gradient(
            loss_single,
            P,
            (X, Y),
            "k",  # pyright: ignore[reportArgumentType]
            clip_norm=1.0,
            noise_multiplier=1.0,
        ),
        TypeError,
        "key",
    ),
    (
        "dpg-key-none",
        lambda: privacy.dp_gradient(
            loss_single,
            P,
            (X, Y),
            None,  # pyright: ignore[reportArgumentType]
            clip_norm=1.0,
            noise_multiplier=1.0,
        ),
        TypeError,
        "key",
    ),
    (
        "dpg-clip-zero",
        lambda: privacy.dp_gradient(
            loss_single, P, (X, Y), KEY, clip_norm=0.0, noise_multiplier=1.0
        ),
        ValueError,
        "clip_norm",
    ),
    (
        "dpg-clip-nan",
        lambda: privacy.dp_gradient(
            loss_single, P, (X, Y), KEY, clip_norm=NAN, noise_multiplier=1.0
        ),
        ValueError,
        "clip_norm",
    ),
    (
        "dpg-nm-nan",
        lambda: privacy.dp_gradient(
            loss_single, P, (X, Y), KEY, clip_norm=1.0, noise_multiplier=NAN
        ),
        ValueError,
        "noise_multiplier",
    ),
    (
        "dpg-nm-neg",
        lambda: privacy.dp_gradient(
            loss_single, P, (X, Y), KEY, clip_norm=1.0, noise_multiplier=-0.5
        ),
        ValueError,
        "noise_multiplier",
    ),
    (
        "dpg-chunk-zero",
        lambda: privacy.dp_gradient(
            loss_single, P, (X, Y), KEY, clip_norm=1.0, noise_multiplier=1.0, chunk_size=0
        ),
        ValueError,
        "chunk_size",
    ),
    (
        "dpg-method",
        lambda: privacy.dp_gradient(
            loss_single,
            P,
            (X, Y),
            KEY,
            clip_norm=1.0,
            noise_multiplier=1.0,
            method="magic",  # pyright: ignore[reportArgumentType]
        ),
        ValueError,
        "method",
    ),
    (
        "dpg-loss-str",
        lambda: privacy.dp_gradient("loss", P, (X, Y), KEY, clip_norm=1.0, noise_multiplier=1.0),  # pyright: ignore[reportArgumentType]
        TypeError,
        "loss",
    ),
    ("poisson-n-zero", lambda: privacy.poisson_batch(KEY, 0, 0.5, 4), ValueError, "n"),
    ("poisson-n-neg", lambda: privacy.poisson_batch(KEY, -5, 0.5, 4), ValueError, "n"),
    ("poisson-n-str", lambda: privacy.poisson_batch(KEY, "10", 0.5, 4), TypeError, "n"),  # pyright: ignore[reportArgumentType]
    ("poisson-n-float", lambda: privacy.poisson_batch(KEY, 10.0, 0.5, 4), TypeError, "n"),  # pyright: ignore[reportArgumentType]
    (
        "poisson-rate-zero",
        lambda: privacy.poisson_batch(KEY, 10, 0.0, 4),
        ValueError,
        "sample_rate",
    ),
    ("poisson-rate-big", lambda: privacy.poisson_batch(KEY, 10, 1.5, 4), ValueError, "sample_rate"),
    ("poisson-rate-nan", lambda: privacy.poisson_batch(KEY, 10, NAN, 4), ValueError, "sample_rate"),
    (
        "poisson-rate-str",
        lambda: privacy.poisson_batch(KEY, 10, "0.5", 4),  # pyright: ignore[reportArgumentType]
        TypeError,
        "sample_rate",
    ),
    (
        "poisson-max-zero",
        lambda: privacy.poisson_batch(KEY, 10, 0.5, 0),
        ValueError,
        "max_batch_size",
    ),
    (
        "poisson-max-float",
        lambda: privacy.poisson_batch(KEY, 10, 0.5, 4.5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "max_batch_size",
    ),
    ("poisson-key-str", lambda: privacy.poisson_batch("k", 10, 0.5, 4), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    ("shuffled-bs-zero", lambda: privacy.shuffled_batches(KEY, 10, 0), ValueError, "batch_size"),
    ("shuffled-bs-big", lambda: privacy.shuffled_batches(KEY, 10, 11), ValueError, "batch_size"),
    ("shuffled-n-zero", lambda: privacy.shuffled_batches(KEY, 0, 1), ValueError, "n"),
    ("shuffled-n-str", lambda: privacy.shuffled_batches(KEY, "10", 2), TypeError, "n"),  # pyright: ignore[reportArgumentType]
    ("shuffled-key-str", lambda: privacy.shuffled_batches("k", 10, 2), TypeError, "key"),  # pyright: ignore[reportArgumentType]
    (
        "eps-nm-nan",
        lambda: privacy.epsilon(noise_multiplier=NAN, sample_rate=0.01, steps=100, delta=1e-5),
        ValueError,
        "noise_multiplier",
    ),
    (
        "eps-nm-neg",
        lambda: privacy.epsilon(noise_multiplier=-1.0, sample_rate=0.01, steps=100, delta=1e-5),
        ValueError,
        "noise_multiplier",
    ),
    (
        "eps-nm-bool",
        lambda: privacy.epsilon(noise_multiplier=True, sample_rate=0.01, steps=100, delta=1e-5),
        TypeError,
        "noise_multiplier",
    ),
    (
        "eps-nm-np-nan",
        lambda: privacy.epsilon(
            noise_multiplier=np.float64(NAN), sample_rate=0.01, steps=100, delta=1e-5
        ),
        ValueError,
        "noise_multiplier",
    ),
    (
        "eps-steps-np-zero",
        lambda: privacy.epsilon(
            noise_multiplier=1.0,
            sample_rate=0.01,
            steps=np.int64(0),
            delta=1e-5,
        ),
        ValueError,
        "steps",
    ),
    (
        "eps-rate-zero",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.0, steps=100, delta=1e-5),
        ValueError,
        "sample_rate",
    ),
    (
        "eps-rate-big",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=1.5, steps=100, delta=1e-5),
        ValueError,
        "sample_rate",
    ),
    (
        "eps-rate-nan",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=NAN, steps=100, delta=1e-5),
        ValueError,
        "sample_rate",
    ),
    (
        "eps-rate-str",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate="0.01", steps=100, delta=1e-5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "sample_rate",
    ),
    (
        "eps-steps-zero",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=0, delta=1e-5),
        ValueError,
        "steps",
    ),
    (
        "eps-steps-float",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=2.5, delta=1e-5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "steps",
    ),
    (
        "eps-steps-str",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps="100", delta=1e-5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "steps",
    ),
    (
        "eps-delta-zero",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=0.0),
        ValueError,
        "delta",
    ),
    (
        "eps-delta-one",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=1.0),
        ValueError,
        "delta",
    ),
    (
        "eps-delta-nan",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta=NAN),
        ValueError,
        "delta",
    ),
    (
        "eps-delta-str",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=100, delta="1e-5"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "delta",
    ),
    (
        "eps-accountant",
        lambda: privacy.epsilon(
            noise_multiplier=1.0,
            sample_rate=0.01,
            steps=100,
            delta=1e-5,
            accountant="moments",  # pyright: ignore[reportArgumentType]
        ),
        ValueError,
        "accountant",
    ),
    (
        "nmf-eps-zero",
        lambda: privacy.noise_multiplier_for(epsilon=0.0, sample_rate=0.01, steps=100, delta=1e-5),
        ValueError,
        "epsilon",
    ),
    (
        "nmf-eps-nan",
        lambda: privacy.noise_multiplier_for(epsilon=NAN, sample_rate=0.01, steps=100, delta=1e-5),
        ValueError,
        "epsilon",
    ),
    (
        "nmf-eps-inf",
        lambda: privacy.noise_multiplier_for(epsilon=INF, sample_rate=0.01, steps=100, delta=1e-5),
        ValueError,
        "epsilon",
    ),
    (
        "nmf-eps-str",
        lambda: privacy.noise_multiplier_for(epsilon="1", sample_rate=0.01, steps=100, delta=1e-5),  # pyright: ignore[reportArgumentType]
        TypeError,
        "epsilon",
    ),
    (
        "nmf-delta-zero",
        lambda: privacy.noise_multiplier_for(epsilon=1.0, sample_rate=0.01, steps=100, delta=0.0),
        ValueError,
        "delta",
    ),
    (
        "nmf-rate-nan",
        lambda: privacy.noise_multiplier_for(epsilon=1.0, sample_rate=NAN, steps=100, delta=1e-5),
        ValueError,
        "sample_rate",
    ),
    (
        "nmf-steps-neg",
        lambda: privacy.noise_multiplier_for(epsilon=1.0, sample_rate=0.01, steps=-1, delta=1e-5),
        ValueError,
        "steps",
    ),
    (
        "nmf-accountant",
        lambda: privacy.noise_multiplier_for(
            epsilon=1.0,
            sample_rate=0.01,
            steps=100,
            delta=1e-5,
            accountant="x",  # pyright: ignore[reportArgumentType]
        ),
        ValueError,
        "accountant",
    ),
    (
        "dp-epoch-bs-zero",
        lambda: privacy.make_dp_train_epoch(loss_single, 0, clip_norm=1.0, noise_multiplier=1.0),
        ValueError,
        "batch_size",
    ),
    (
        "dp-epoch-clip-zero",
        lambda: privacy.make_dp_train_epoch(loss_single, 2, clip_norm=0.0, noise_multiplier=1.0),
        ValueError,
        "clip_norm",
    ),
    (
        "dp-epoch-nm-nan",
        lambda: privacy.make_dp_train_epoch(loss_single, 2, clip_norm=1.0, noise_multiplier=NAN),
        ValueError,
        "noise_multiplier",
    ),
    (
        "dp-epoch-sampler",
        lambda: train.make_epoch(
            privacy.dp_gradient_fn(loss_single, clip_norm=1.0, noise_multiplier=1.0),
            "x",  # pyright: ignore[reportArgumentType]
        ),
        TypeError,
        "sampler",
    ),
    ("noise-bs-zero", lambda: privacy.add_dp_noise(P, KEY, 1.0, 1.0, 0), ValueError, "batch_size"),
    ("noise-bs-neg", lambda: privacy.add_dp_noise(P, KEY, 1.0, 1.0, -3), ValueError, "batch_size"),
    ("noise-bs-nan", lambda: privacy.add_dp_noise(P, KEY, 1.0, 1.0, NAN), ValueError, "batch_size"),
    (
        "noise-bs-str",
        lambda: privacy.add_dp_noise(P, KEY, 1.0, 1.0, "4"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "batch_size",
    ),
    ("noise-summed-str", lambda: privacy.add_dp_noise("s", KEY, 1.0, 1.0, 4), TypeError, "summed"),
    (
        "dpg-batch-empty",
        lambda: privacy.dp_gradient(
            loss_single, P, (X[:0], Y[:0]), KEY, clip_norm=1.0, noise_multiplier=1.0
        ),
        ValueError,
        "batch",
    ),
    (
        "dp-epoch-loss-str",
        lambda: privacy.make_dp_train_epoch("loss", 2, clip_norm=1.0, noise_multiplier=1.0),  # pyright: ignore[reportArgumentType]  # bad input on purpose
        TypeError,
        "loss",
    ),
    ("poisson-sampler-bs", lambda: privacy.PoissonSampler(0), ValueError, "batch_size"),
    ("noise-clip-inf", lambda: privacy.add_dp_noise(P, KEY, INF, 1.0, 4), ValueError, "clip_norm"),
    (
        "dpg-clip-inf",
        lambda: privacy.dp_gradient(
            loss_single, P, (X, Y), KEY, clip_norm=INF, noise_multiplier=1.0
        ),
        ValueError,
        "clip_norm",
    ),
]

PROBS = np.asarray([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]])
LABELS = np.asarray([0, 1, 1, 0])

LABEL_ERRORS: list[Row] = [
    ("cl-probs-str", lambda: label_errors.confident_learning("p", LABELS), TypeError, "pred_probs"),
    (
        "cl-probs-1d",
        lambda: label_errors.confident_learning(PROBS[:, 0], LABELS),
        ValueError,
        "pred_probs",
    ),
    (
        "cl-probs-empty",
        lambda: label_errors.confident_learning(PROBS[:0], LABELS[:0]),
        ValueError,
        "pred_probs",
    ),
    (
        "cl-probs-nan",
        lambda: label_errors.confident_learning(np.where(PROBS > 0.85, NAN, PROBS), LABELS),
        ValueError,
        "pred_probs",
    ),
    (
        "cl-probs-neg",
        lambda: label_errors.confident_learning(PROBS - 0.5, LABELS),
        ValueError,
        "pred_probs",
    ),
    (
        "cl-labels-len",
        lambda: label_errors.confident_learning(PROBS, LABELS[:3]),
        ValueError,
        "labels",
    ),
    (
        "cl-labels-range",
        lambda: label_errors.confident_learning(PROBS, LABELS + 1),
        ValueError,
        "labels",
    ),
    (
        "cl-labels-float",
        lambda: label_errors.confident_learning(PROBS, LABELS * 1.0),
        TypeError,
        "labels",
    ),
    ("cl-labels-none", lambda: label_errors.confident_learning(PROBS, None), TypeError, "labels"),  # pyright: ignore[reportArgumentType]
    (
        "cl-ranked-by",
        lambda: label_errors.confident_learning(PROBS, LABELS, ranked_by="loss"),  # pyright: ignore[reportArgumentType]
        ValueError,
        "ranked_by",
    ),
    (
        "fle-num-classes",
        lambda: label_errors.find_label_errors(X, Y, num_classes=0),
        ValueError,
        "num_classes",
    ),
    (
        "fle-hidden-zero",
        lambda: label_errors.find_label_errors(X, LABELS, model=label_errors.MLP(hidden=(0,))),
        ValueError,
        "hidden",
    ),
    (
        "fle-hidden-int",
        lambda: label_errors.find_label_errors(X, LABELS, model=label_errors.MLP(hidden=4)),  # pyright: ignore[reportArgumentType]
        TypeError,
        "hidden",
    ),
    ("fle-x-str", lambda: label_errors.find_label_errors("x", LABELS), TypeError, "x"),
    (
        "fle-x-nan",
        lambda: label_errors.find_label_errors(np.full((4, 3), NAN), LABELS),
        ValueError,
        "x",
    ),
    ("fle-y-len", lambda: label_errors.find_label_errors(X, LABELS[:3]), ValueError, "y"),
    ("fle-y-neg", lambda: label_errors.find_label_errors(X, LABELS - 1), ValueError, "y"),
    (
        "fle-folds-one",
        lambda: label_errors.find_label_errors(X, LABELS, folds=label_errors.Folds(1)),
        ValueError,
        "n_splits",
    ),
    (
        "fle-repeats-zero",
        lambda: label_errors.find_label_errors(X, LABELS, folds=label_errors.Folds(n_repeats=0)),
        ValueError,
        "n_repeats",
    ),
    (
        "fle-seed-neg",
        lambda: label_errors.find_label_errors(X, LABELS, seed=-1),
        ValueError,
        "seed",
    ),
    (
        "fle-batch-zero",
        lambda: label_errors.find_label_errors(
            X, LABELS, training=label_errors.Training(batch_size=0)
        ),
        ValueError,
        "batch_size",
    ),
    (
        "fle-epochs-zero",
        lambda: label_errors.find_label_errors(X, LABELS, training=label_errors.Training(epochs=0)),
        ValueError,
        "epochs",
    ),
    (
        "fle-apply-no-init",
        lambda: label_errors.find_label_errors(
            X, LABELS, model=label_errors.Classifier(models.mlp_apply)
        ),
        TypeError,
        "init",
    ),
    (
        "cl-probs-int",
        lambda: label_errors.confident_learning(np.eye(2, dtype=int)[LABELS], LABELS),  # pyright: ignore[reportArgumentType, reportCallIssue]
        TypeError,
        "pred_probs",
    ),
    ("top-k-neg", lambda: label_errors.confident_learning(PROBS, LABELS).top(-1), ValueError, "k"),
    (
        "fle-ranked-by",
        lambda: label_errors.find_label_errors(
            X,
            LABELS,
            scoring=label_errors.Scoring(ranked_by="x"),  # pyright: ignore[reportArgumentType]
        ),
        ValueError,
        "ranked_by",
    ),
    (
        "oof-folds-one",
        lambda: label_errors.out_of_fold_probabilities(models.mlp_apply, MLP, X, LABELS, folds=1),
        ValueError,
        "folds",
    ),
    (
        "oof-epochs-zero",
        lambda: label_errors.out_of_fold_probabilities(
            models.mlp_apply, MLP, X, LABELS, folds=2, epochs=0
        ),
        ValueError,
        "epochs",
    ),
    (
        "oof-batch-zero",
        lambda: label_errors.out_of_fold_probabilities(
            models.mlp_apply, MLP, X, LABELS, folds=2, batch_size=0
        ),
        ValueError,
        "batch_size",
    ),
    (
        "oof-patience-zero",
        lambda: label_errors.out_of_fold_probabilities(
            models.mlp_apply, MLP, X, LABELS, folds=2, patience=0
        ),
        ValueError,
        "patience",
    ),
    (
        "oof-apply-str",
        lambda: label_errors.out_of_fold_probabilities("apply", MLP, X, LABELS, folds=2),  # pyright: ignore[reportArgumentType]
        TypeError,
        "apply_fn",
    ),
    ("folds-zero", lambda: label_errors.stratified_folds(LABELS, 0), ValueError, "folds"),
    ("folds-str", lambda: label_errors.stratified_folds(LABELS, "2"), TypeError, "folds"),  # pyright: ignore[reportArgumentType]
    ("folds-labels-str", lambda: label_errors.stratified_folds("abc", 2), TypeError, "labels"),  # pyright: ignore[reportArgumentType]
]

COMPILATION: list[Row] = [
    ("counter-target-int", lambda: compilation.CompileCounter(3), TypeError, "target"),
    ("budget-neg", lambda: compilation.CompileBudget(-1), ValueError, "max_compiles"),
    ("budget-float", lambda: compilation.CompileBudget(1.5), TypeError, "max_compiles"),  # pyright: ignore[reportArgumentType]
    ("budget-str", lambda: compilation.CompileBudget("2"), TypeError, "max_compiles"),  # pyright: ignore[reportArgumentType]
    ("budget-bool", lambda: compilation.CompileBudget(True), TypeError, "max_compiles"),
    (
        "budget-on-exceed",
        lambda: compilation.CompileBudget(1, on_exceed="ignore"),  # pyright: ignore[reportArgumentType]
        ValueError,
        "on_exceed",
    ),
    ("budget-target-float", lambda: compilation.CompileBudget(1, 2.5), TypeError, "target"),
    ("decorator-neg", lambda: compilation.compile_budget(-1), ValueError, "max_compiles"),
    (
        "decorator-on-exceed",
        lambda: compilation.compile_budget(1, on_exceed="x"),  # pyright: ignore[reportArgumentType]
        ValueError,
        "on_exceed",
    ),
    (
        "decorator-not-callable",
        lambda: compilation.compile_budget(1)(3),  # pyright: ignore[reportArgumentType]
        TypeError,
        "decorates a function",
    ),
    ("stage-str", lambda: compilation.stage_report("f"), TypeError, "jitted"),  # pyright: ignore[reportArgumentType]
    ("counter-explain-str", lambda: compilation.CompileCounter(explain="y"), TypeError, "explain"),  # pyright: ignore[reportArgumentType]
    ("parse-int", lambda: compilation.parse_cache_miss(3), TypeError, "text"),  # pyright: ignore[reportArgumentType]
    ("budget-exact-str", lambda: compilation.CompileBudget(1, exact="y"), TypeError, "exact"),  # pyright: ignore[reportArgumentType]
    (
        "counter-include-eager",
        lambda: compilation.CompileCounter(include_eager=1),  # pyright: ignore[reportArgumentType]
        TypeError,
        "include_eager",
    ),
]

BUCKETS: list[Row] = [
    ("bucket-too-big", lambda: buckets.bucket_for(10, [4, 8]), ValueError, "n"),
    ("bucket-neg", lambda: buckets.bucket_for(-1, [4]), ValueError, "n"),
    ("bucket-float", lambda: buckets.bucket_for(3.5, [4]), TypeError, "n"),  # pyright: ignore[reportArgumentType]
    ("bucket-empty", lambda: buckets.bucket_for(3, []), ValueError, "buckets"),
    ("bucket-zero", lambda: buckets.bucket_for(3, [0, 4]), ValueError, "buckets"),
    ("bucket-str", lambda: buckets.bucket_for(3, "48"), TypeError, "buckets"),  # pyright: ignore[reportArgumentType]
    ("pad-x-str", lambda: buckets.pad_to_bucket("x", [4]), TypeError, "x"),
    ("pad-axis", lambda: buckets.pad_to_bucket(np.ones(3), [4], axis=2), ValueError, "axis"),
    ("pad-too-long", lambda: buckets.pad_to_bucket(np.ones(9), [4, 8]), ValueError, "buckets"),
    ("plan-max-zero", lambda: buckets.plan_buckets([3, 4], 0), ValueError, "max_buckets"),
    ("plan-empty", lambda: buckets.plan_buckets([], 2), ValueError, "lengths"),
    ("plan-neg", lambda: buckets.plan_buckets([-1, 3], 2), ValueError, "lengths"),
    ("plan-str", lambda: buckets.plan_buckets("abc", 2), TypeError, "lengths"),  # pyright: ignore[reportArgumentType]
    ("pow2-neg", lambda: buckets.power_of_two_buckets(-1), ValueError, "max_len"),
    (
        "pow2-min-zero",
        lambda: buckets.power_of_two_buckets(8, min_bucket=0),
        ValueError,
        "min_bucket",
    ),
    ("waste-too-long", lambda: buckets.padding_waste([5], [4]), ValueError, "largest bucket"),
    (
        "bf-fn-str",
        lambda: buckets.BucketedFunction("f", [4], [buckets.Padded((None,), jnp.float32)]),  # pyright: ignore[reportArgumentType]
        TypeError,
        "fn",
    ),
    (
        "bf-buckets-empty",
        lambda: buckets.BucketedFunction(lambda x: x, [], [buckets.Padded((None,), jnp.float32)]),
        ValueError,
        "buckets",
    ),
]

TREE: list[Row] = [
    ("mask-regex", lambda: tree.mask_by_path(P, "(w"), ValueError, "predicate_or_regex"),
    ("mask-int", lambda: tree.mask_by_path(P, 3), TypeError, "predicate_or_regex"),  # pyright: ignore[reportArgumentType]
    ("mask-none", lambda: tree.mask_by_path(P, None), TypeError, "predicate_or_regex"),  # pyright: ignore[reportArgumentType]
    ("allclose-rtol-neg", lambda: tree.tree_allclose(P, P, rtol=-1.0), ValueError, "rtol"),
    ("allclose-rtol-nan", lambda: tree.tree_allclose(P, P, rtol=NAN), ValueError, "rtol"),
    ("allclose-atol-str", lambda: tree.tree_allclose(P, P, atol="x"), TypeError, "atol"),  # pyright: ignore[reportArgumentType]
    (
        "allclose-equal-nan-str",
        lambda: tree.tree_allclose(P, P, equal_nan="y"),  # pyright: ignore[reportArgumentType]
        TypeError,
        "equal_nan",
    ),
    ("allclose-leaf-str", lambda: tree.tree_allclose({"a": "x"}, {"a": "y"}), TypeError, "a.a"),
]

DATA: list[Row] = [
    ("spiral-n-zero", lambda: data.make_spiral(0), ValueError, "n_per_class"),
    ("spiral-n-neg", lambda: data.make_spiral(-1), ValueError, "n_per_class"),
    ("spiral-n-float", lambda: data.make_spiral(2.5), ValueError, "n_per_class"),  # pyright: ignore[reportArgumentType]
    ("spiral-classes-zero", lambda: data.make_spiral(10, 0), ValueError, "n_classes"),
    ("spiral-noise-neg", lambda: data.make_spiral(10, noise=-1.0), ValueError, "noise"),
    ("spiral-noise-nan", lambda: data.make_spiral(10, noise=NAN), ValueError, "noise"),
    ("blobs-n-zero", lambda: data.make_blobs(0), ValueError, "n"),
    ("blobs-features-zero", lambda: data.make_blobs(10, n_features=0), ValueError, "n_features"),
    ("blobs-classes-zero", lambda: data.make_blobs(10, n_classes=0), ValueError, "n_classes"),
    ("flip-neg", lambda: data.flip_labels(LABELS, -1, 2), ValueError, "n_flip"),
    ("flip-too-many", lambda: data.flip_labels(LABELS, 5, 2), ValueError, "n_flip"),
    ("flip-classes", lambda: data.flip_labels(LABELS, 1, 1), ValueError, "n_classes"),
    (
        "split-zero",
        lambda: data.train_test_split(np.ones(4), test_fraction=0.0),
        ValueError,
        "test_fraction",
    ),
    (
        "split-one",
        lambda: data.train_test_split(np.ones(4), test_fraction=1.0),
        ValueError,
        "test_fraction",
    ),
    (
        "split-nan",
        lambda: data.train_test_split(np.ones(4), test_fraction=NAN),
        ValueError,
        "test_fraction",
    ),
    ("split-none", lambda: data.train_test_split(), ValueError, "array"),
    ("split-mismatch", lambda: data.train_test_split(np.ones(4), np.ones(3)), ValueError, "arrays"),
    ("csv-label-int", lambda: data.load_csv(_csv(), 3), ValueError, "label column"),  # pyright: ignore[reportArgumentType]
    ("csv-label-missing", lambda: data.load_csv(_csv(), "nope"), ValueError, "nope"),
    ("spiral-seed-neg", lambda: data.make_spiral(10, seed=-1), ValueError, "seed"),
    ("spiral-seed-str", lambda: data.make_spiral(10, seed="a"), TypeError, "seed"),  # pyright: ignore[reportArgumentType]
    ("blobs-std-neg", lambda: data.make_blobs(10, std=-1.0), ValueError, "std"),
    ("blobs-std-nan", lambda: data.make_blobs(10, std=NAN), ValueError, "std"),
    ("blobs-sep-inf", lambda: data.make_blobs(10, separation=INF), ValueError, "separation"),
    ("flip-y-str", lambda: data.flip_labels("abc", 1, 2), TypeError, "y"),  # pyright: ignore[reportArgumentType]
    ("flip-y-range", lambda: data.flip_labels(LABELS + 5, 1, 2), ValueError, "y"),
    ("flip-n-float", lambda: data.flip_labels(LABELS, 1.5, 2), TypeError, "n_flip"),  # pyright: ignore[reportArgumentType]
    ("split-str", lambda: data.train_test_split("abcd"), TypeError, "arrays"),  # pyright: ignore[reportArgumentType]
    ("split-seed-str", lambda: data.train_test_split(np.ones(4), seed="s"), TypeError, "seed"),  # pyright: ignore[reportArgumentType]
    ("csv-path-int", lambda: data.load_csv(123, "label"), TypeError, "path"),  # pyright: ignore[reportArgumentType]
    ("csv-path-none", lambda: data.load_csv(None, "label"), TypeError, "path"),  # pyright: ignore[reportArgumentType]
    ("features-names-str", lambda: data.load_features(_csv(), "a"), TypeError, "feature_names"),  # pyright: ignore[reportArgumentType]
    ("features-path-none", lambda: data.load_features(None, ("a", "b")), TypeError, "path"),  # pyright: ignore[reportArgumentType]
]


def _csv() -> Path:
    path = _tmp() / "tiny.csv"
    if not path.exists():
        path.write_text("a,b,label\n1,2,x\n3,4,y\n5,6,x\n")
    return path


DIAGNOSE: list[Row] = [
    ("consts-fn-str", lambda: diagnose.captured_constants("f"), TypeError, "fn"),  # pyright: ignore[reportArgumentType]
    (
        "consts-threshold",
        lambda: diagnose.captured_constants(lambda x: x, 1.0, threshold_bytes=-1),
        ValueError,
        "threshold_bytes",
    ),
    ("why-fn-str", lambda: diagnose.why_recompiled("f", [(1.0,)]), TypeError, "fn"),  # pyright: ignore[reportArgumentType]
    ("why-calls-str", lambda: diagnose.why_recompiled(lambda x: x, "abc"), TypeError, "calls"),
    ("why-calls-int", lambda: diagnose.why_recompiled(lambda x: x, 3), TypeError, "calls"),  # pyright: ignore[reportArgumentType]
]

GROUPS = {
    "optim": OPTIM,
    "schedules": SCHEDULES,
    "models": MODELS,
    "train": TRAIN,
    "prefetch": PREFETCH,
    "per_example": PER_EXAMPLE,
    "privacy": PRIVACY,
    "label_errors": LABEL_ERRORS,
    "compilation": COMPILATION,
    "buckets": BUCKETS,
    "tree": TREE,
    "data": DATA,
    "diagnose": DIAGNOSE,
}
ROWS: list[Row] = [(f"{g}:{r[0]}", *r[1:]) for g, rows in GROUPS.items() for r in rows]


@pytest.fixture(autouse=True)
def _tmp_dir(tmp_path: Path) -> Any:
    _TMP.insert(0, tmp_path)
    yield
    _TMP.remove(tmp_path)


def _raised_in_jaxwise(err: BaseException) -> bool:
    """True when the innermost frame that raised ``err`` is jaxwise's own source."""
    frames = traceback.extract_tb(err.__traceback__)
    return bool(frames) and "/jaxwise/" in frames[-1].filename.replace("\\", "/")


def test_rows_are_unique_and_enough() -> None:
    ids = [row[0] for row in ROWS]
    assert len(ids) == len(set(ids))
    assert len(ROWS) >= 150


@pytest.mark.parametrize(("call", "kind", "name"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_bad_call_names_the_argument(
    call: Callable[[], Any], kind: type[Exception], name: str
) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    err = info.value
    assert isinstance(err, kind), f"{type(err).__name__}: {err}"
    assert name in str(err), f"message does not name {name!r}: {err}"
    assert _raised_in_jaxwise(err), f"raised outside jaxwise: {type(err).__name__}: {err}"


# --------------------------------------------------------------------------
# Finite in, finite out (no silent NaN/inf from finite input)
# --------------------------------------------------------------------------


def _finite(tree_: Any) -> bool:
    return all(bool(np.all(np.isfinite(np.asarray(x)))) for x in jax.tree.leaves(tree_))


Z = jnp.zeros((4, 3))  # zero inputs: every per-example gradient of `loss_single` is 0
ZERO_P = jax.tree.map(jnp.zeros_like, P)  # a zero gradient

FINITE: list[tuple[str, Callable[[], Any]]] = [
    (
        "norms-vmap-zero-grad",
        lambda: pe.per_example_grad_norms(loss_single, P, (Z, Y), method="vmap"),
    ),
    (
        "norms-ghost-zero-grad",
        lambda: pe.per_example_grad_norms(loss_single, P, (Z, Y), method="ghost"),
    ),
    ("clip-zero-grad", lambda: pe.clip_and_sum(loss_single, P, (Z, Y), clip_norm=1.0)),
    ("clip-tiny-norm", lambda: pe.clip_and_sum(loss_single, P, (X, Y), clip_norm=1e-30)),
    (
        "dp-gradient-zero-grad",
        lambda: privacy.dp_gradient(
            loss_single, P, (Z, Y), KEY, clip_norm=1.0, noise_multiplier=0.0
        ),
    ),
    ("dp-noise-zero", lambda: privacy.add_dp_noise(P, KEY, 1.0, 0.0, 4)),
    (
        "epsilon-small-rate",
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=1e-6, steps=10, delta=1e-5),
    ),
    (
        "epsilon-full-batch",
        lambda: privacy.epsilon(noise_multiplier=0.5, sample_rate=1.0, steps=1, delta=1e-5),
    ),
    ("global-norm-zero", lambda: optim.global_norm({"a": jnp.zeros(3)})),
    ("global-norm-big-f16", lambda: optim.global_norm({"a": jnp.full(4, 6e4, jnp.float16)})),
    (
        "clip-zero-update",
        lambda: optim.clip_by_global_norm(1.0).update(
            {"a": jnp.zeros(3)},
            optim.clip_by_global_norm(1.0).init(None),  # pyright: ignore[reportArgumentType]
        )[0],
    ),
    ("cosine-far-step", lambda: optim.cosine_decay_schedule(1.0, 10)(10**6)),
    ("linear-zero-steps", lambda: optim.linear_schedule(1.0, 0.0, 0)(5)),
    ("warmup-zero-steps", lambda: optim.warmup_cosine_decay_schedule(0.0, 1.0, 0, 10)(0)),
    (
        "cl-hard-probs",
        lambda: (
            label_errors.confident_learning(
                np.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]), LABELS
            ).score
        ),
    ),
    ("mlp-big-input", lambda: models.mlp_apply(MLP, jnp.full((2, 3), 1e3))),
    (
        "cl-hard-probs-margin",
        lambda: (
            label_errors.confident_learning(
                np.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]]),
                LABELS,
                ranked_by="normalized_margin",
            ).score
        ),
    ),
    (
        "adam-zero-grad",
        lambda: (lambda tx: tx.update(ZERO_P, tx.init(P), P)[0])(
            optim.adamw(0.1, weight_decay=0.0)
        ),
    ),
    ("lion-zero-grad", lambda: (lambda tx: tx.update(ZERO_P, tx.init(P), P)[0])(optim.lion(0.1))),
    (
        "norms-ghost-mlp-zero-input",
        lambda: pe.per_example_grad_norms(
            models.mlp_loss(lambda logits, y: -jax.nn.log_softmax(logits)[y]),
            MLP,
            (jnp.zeros((4, 3)), Y),
            method="ghost",
        ),
    ),
]


@pytest.mark.parametrize("call", [r[1] for r in FINITE], ids=[r[0] for r in FINITE])
def test_finite_in_finite_out(call: Callable[[], Any]) -> None:
    out = call()
    assert _finite(out), out


def test_adam_zero_eps_zero_gradient_is_not_applied() -> None:
    """adam(eps=0) turns a zero gradient into 0/0: the NaN guard must skip that update."""
    step = train.make_train_step(lambda p, b: jnp.sum(p["w"] * 0.0))
    state = train.TrainState.create({"w": jnp.ones(3)}, optim.adam(0.1, eps=0.0), KEY)
    state, metrics = step(state, X)
    assert _finite(state.params)
    assert int(metrics["skipped"]) == 1
    assert math.isfinite(float(metrics["loss"]))


# --------------------------------------------------------------------------
# Issue #25: the library's edges (deleted arrays, shapes, dtypes, empty inputs)
# --------------------------------------------------------------------------


def _deleted(shape: tuple[int, ...] = (3,)) -> jax.Array:
    x = jnp.ones(shape)
    x.delete()  # what donating it to a jitted step does
    return x


def _donated_state() -> train.TrainState:
    tx = optim.sgd(0.1)
    state = train.TrainState.create({"w": jnp.ones(3)}, tx, KEY)
    train.make_train_step(lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2))(
        state, (X, jnp.ones(4))
    )
    return state  # its arrays now belong to the step's result


def _linear(p: Any, b: Any) -> jax.Array:
    return jnp.mean((b[0] @ p["w"] - b[1]) ** 2)


def _step(params: Any, batch: Any) -> Any:
    tx = optim.sgd(0.1)
    return train.make_train_step(_linear)(train.TrainState.create(params, tx, KEY), batch)


EDGES: list[tuple[str, Callable[[], Any], type[Exception], str]] = [
    (
        "create-donated-params",
        lambda: train.TrainState.create(_donated_state().params, optim.sgd(0.1), KEY),
        ValueError,
        "`params` leaf `w` was deleted: this array was donated to an earlier call",
    ),
    (
        "create-deleted-model-state",
        lambda: train.TrainState.create(P, optim.sgd(0.1), KEY, model_state={"m": _deleted()}),
        ValueError,
        "`model_state` leaf `m` was deleted: this array was donated",
    ),
    (
        "step-deleted-batch",
        lambda: _step({"w": jnp.ones(3)}, (_deleted((4, 3)), jnp.ones(4))),
        ValueError,
        "`batch` leaf `0` was deleted: this array was donated to an earlier call",
    ),
    (
        "epoch-deleted-data",
        lambda: train.make_train_epoch(_linear, 2)(
            train.TrainState.create({"w": jnp.ones(3)}, optim.sgd(0.1), KEY),
            (_deleted((4, 3)), jnp.ones(4)),
        ),
        ValueError,
        "`data` leaf `0` was deleted: this array was donated",
    ),
    (
        "norms-deleted-params",
        lambda: pe.per_example_grad_norms(loss_single, {"w": _deleted(), "b": 0.0}, (X, Y)),
        ValueError,
        "`params` leaf `w` was deleted: this array was donated",
    ),
    (
        "norms-deleted-batch",
        lambda: pe.per_example_grad_norms(loss_single, P, (_deleted((4, 3)), Y)),
        ValueError,
        "`batch` leaf `0` was deleted: this array was donated",
    ),
    (
        "dp-gradient-deleted-batch",
        lambda: privacy.dp_gradient(
            loss_single, P, (X, _deleted((4,))), KEY, clip_norm=1.0, noise_multiplier=1.0
        ),
        ValueError,
        "`batch` leaf `1` was deleted",
    ),
    (
        "step-leading-dims-differ",
        lambda: _step({"w": jnp.ones(3)}, (jnp.ones((4, 3)), jnp.ones(5))),
        TypeError,
        "batch[0]: float32[4, 3], batch[1]: float32[5] (their leading dimensions differ)",
    ),
    (
        "step-feature-size",
        lambda: _step({"w": jnp.ones(3)}, (jnp.ones((4, 2)), jnp.ones(4))),
        TypeError,
        "with params['w']: float32[3] and batch[0]: float32[4, 2], batch[1]: float32[4]",
    ),
    (
        "step-int-params",
        lambda: _step({"w": jnp.ones(3, jnp.int32)}, (jnp.ones((4, 3)), jnp.ones(4))),
        TypeError,
        "`params` leaf `w` has dtype int32",
    ),
    (
        "step-complex-params",
        lambda: _step({"w": jnp.ones(3, jnp.complex64)}, (jnp.ones((4, 3)), jnp.ones(4))),
        TypeError,
        "`params` leaf `w` has dtype complex64",
    ),
    (
        "step-complex-params-put-in-by-replace",
        lambda: train.make_train_step(_linear)(
            train.TrainState.create({"w": jnp.ones(3)}, optim.sgd(0.1), KEY).replace(
                params={"w": jnp.ones(3, jnp.complex64)}
            ),
            (jnp.ones((4, 3), jnp.complex64), jnp.ones(4, jnp.complex64)),
        ),
        TypeError,
        "`state.params` leaf `w` has dtype complex64",
    ),
    (
        "safe-norm-axis-str",
        lambda: __import__("jaxwise.numerics").numerics.safe_norm(jnp.ones(3), axis="a"),
        TypeError,
        "`axis` must be an int, a tuple of ints or None, got 'a'",
    ),
    (
        "softmax-axis-float",
        lambda: __import__("jaxwise.numerics").numerics.softmax(jnp.ones(3), axis=0.5),
        TypeError,
        "`axis` must be an int",
    ),
    (
        "cross-entropy-negative-weights",
        lambda: __import__("jaxwise.numerics").numerics.cross_entropy(
            jnp.zeros((2, 3)), jnp.asarray([0, 1]), weights=jnp.asarray([1.0, -1.0])
        ),
        ValueError,
        "`weights` must be >= 0, got -1.0",
    ),
    (
        "run-rnn-feature-size",
        lambda: __import__("jaxwise.sequence").sequence.run_rnn(
            __import__("jaxwise.sequence").sequence.gru_cell,
            __import__("jaxwise.sequence").sequence.init_gru(KEY, 3, 4),
            jnp.ones((5, 2)),
            jnp.zeros(4),
        ),
        ValueError,
        "`cell` fails on one step of `xs` (shape (2,): D = 2) with `carry0` of shape (4,)",
    ),
    (
        "run-rnn-carry-size",
        lambda: __import__("jaxwise.sequence").sequence.run_rnn(
            __import__("jaxwise.sequence").sequence.lstm_cell,
            __import__("jaxwise.sequence").sequence.init_lstm(KEY, 3, 4),
            jnp.ones((5, 3)),
            (jnp.zeros(4), jnp.zeros(3)),
        ),
        ValueError,
        "with `carry0` of shape [(4,), (3,)] and `params`",
    ),
    (
        "run-rnn-carry-changes-shape",
        lambda: __import__("jaxwise.sequence").sequence.run_rnn(
            lambda p, h, x: (jnp.concatenate([h, x]), x), None, jnp.ones((5, 2)), jnp.zeros(2)
        ),
        ValueError,
        "`cell` returns a carry of shape (4,), but `carry0` has shape (2,)",
    ),
    (
        "pad-fill-overflows-uint8",
        lambda: buckets.pad_to_bucket(np.ones(3, np.uint8), (4,), fill=300),
        ValueError,
        "`fill` 300 does not fit the dtype uint8 of `x` (it would be stored as 44)",
    ),
    (
        "pad-fill-fraction-in-int",
        lambda: buckets.pad_to_bucket(np.ones(3, np.int32), (4,), fill=0.5),
        ValueError,
        "`fill` 0.5 does not fit the dtype int32",
    ),
    (
        "pad-fill-nan-in-int",
        lambda: buckets.pad_to_bucket(np.ones(3, np.int64), (4,), fill=NAN),
        ValueError,
        "`fill` nan does not fit the dtype int64",
    ),
    (
        "pad-fill-minus-one-in-bool",
        lambda: buckets.pad_to_bucket(np.ones(3, bool), (4,), fill=-1),
        ValueError,
        "`fill` -1 does not fit the dtype bool",
    ),
    (
        "pad-fill-overflows-float16",
        lambda: buckets.pad_to_bucket(np.ones(3, np.float16), (4,), fill=1e5),
        ValueError,
        "`fill` 100000.0 does not fit the dtype float16 of `x` (it would be stored as inf)",
    ),
    (
        "dp-noise-int-leaf",
        lambda: privacy.add_dp_noise({"w": jnp.ones(3, jnp.int32)}, KEY, 1.0, 1.0, 4),
        TypeError,
        "`summed` leaf `w` has dtype int32",
    ),
    (
        "checkpointer-on-a-file",
        lambda: checkpoint.Checkpointer(Path(__file__)),
        ValueError,
        "test_boundary.py: is a file, expected a directory",
    ),
]


@pytest.mark.parametrize(
    ("call", "kind", "message"), [r[1:] for r in EDGES], ids=[r[0] for r in EDGES]
)
def test_an_edge_gets_a_named_error(call: Callable[[], Any], kind: type[Exception], message: str):
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    err = info.value
    assert isinstance(err, kind), f"{type(err).__name__}: {err}"
    assert message in str(err), f"{message!r} not in: {err}"
    assert _raised_in_jaxwise(err), f"raised outside jaxwise: {type(err).__name__}: {err}"


def test_fills_that_fit_are_kept_exactly() -> None:
    for x, fill in [
        (np.ones(3, np.int32), -1),
        (np.ones(3, np.int32), 3.0),
        (np.ones(3, bool), False),
        (np.ones(3, np.float32), NAN),
        (np.ones(3, np.float32), -INF),
        (np.ones(3, np.float32), 0.1),  # rounds to the nearest float32: fine
        (np.ones(3, np.uint8), 255),
    ]:
        padded, mask = buckets.pad_to_bucket(x, (4,), fill=fill)
        assert padded.dtype == x.dtype and mask.tolist() == [True, True, True, False]
        np.testing.assert_array_equal(padded[3], np.asarray(fill).astype(x.dtype))


def test_empty_inputs_follow_numpy_and_jax_nn() -> None:
    from jaxwise import numerics

    for shape, axis in [((0,), -1), ((2, 0), -1), ((0, 3), -1), ((2, 0), 0)]:
        x = jnp.zeros(shape)
        for ours, theirs in [
            (numerics.softmax, jax.nn.softmax),
            (numerics.log_softmax, jax.nn.log_softmax),
        ]:
            out = ours(x, axis=axis)
            assert out.shape == theirs(x, axis=axis).shape == shape and out.dtype == x.dtype
        norm = numerics.safe_norm(x, axis=axis)
        np.testing.assert_array_equal(norm, np.linalg.norm(np.zeros(shape), axis=axis))
        kept = numerics.safe_norm(x, axis=axis, keepdims=True)
        assert kept.shape == np.linalg.norm(np.zeros(shape), axis=axis, keepdims=True).shape
        cos = numerics.cosine_similarity(x, x, axis=axis)
        assert cos.shape == norm.shape and not np.asarray(cos).any()  # empty vectors: 0
    assert float(numerics.safe_norm(jnp.zeros((0,)))) == float(np.linalg.norm(np.zeros(0))) == 0
    grad = jax.grad(lambda v: numerics.safe_norm(v) + numerics.cosine_similarity(v, v))(
        jnp.zeros((0,))
    )
    assert grad.shape == (0,)

"""Tests for jaxwise.train: state, donation, NaN guard, epochs, checkpoints, data parallelism."""

import dataclasses
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from host64 import cpu_devices, mesh_devices
from jax.sharding import PartitionSpec as P

import jaxwise.privacy
import jaxwise.train
from jaxwise import optim
from jaxwise._shared._backends import assume_backend
from jaxwise.checkpoint import CheckpointError, latest_step, load_metadata, restore, save
from jaxwise.compilation import CompileBudget, CompileCounter
from jaxwise.sharding import data_mesh
from jaxwise.train import (
    DonationError,
    TrainState,
    check_donatable,
    check_optimizer_fits,
    make_train_epoch,
    make_train_step,
    type_signature,
)
from jaxwise.train._program._sampler import shuffle_hash
from jaxwise.tree import host_copy


def init_params(key, sizes=(4, 16, 3)):
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        params[f"dense_{i}"] = {"w": jax.random.normal(sub, (a, b)) / np.sqrt(a), "b": jnp.zeros(b)}
    return params


def apply(params, x):
    n = len(params)
    for i in range(n):
        x = x @ params[f"dense_{i}"]["w"] + params[f"dense_{i}"]["b"]
        if i < n - 1:
            x = jnp.tanh(x)
    return x


def loss_fn(params, batch):
    x, y = batch
    logits = apply(params, x)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, y))


def make_data(key, n=96):
    kx, ky = jax.random.split(key)
    x = jax.random.normal(kx, (n, 4))
    y = (x[:, 0] > 0).astype(jnp.int32) + (x[:, 1] > 0).astype(jnp.int32)
    return x, y


@pytest.fixture
def setup(key):
    tx = optim.adamw(1e-2, weight_decay=1e-3)
    state = TrainState.create(init_params(key), tx, jax.random.key(1))
    return tx, state, make_data(jax.random.key(2))


# ---------------------------------------------------------------------------
# TrainState
# ---------------------------------------------------------------------------


def test_state_signature_is_stable_and_fields_frozen(setup):
    tx, state, (x, y) = setup
    before = type_signature(state)
    assert before[-1][0] == "step" or any(name == "step" for name, *_ in before)
    step = make_train_step(loss_fn)
    new, _ = step(state, (x[:32], y[:32]))
    assert type_signature(new) == before
    assert all(not weak for *_, weak in before)
    with pytest.raises(dataclasses.FrozenInstanceError):
        new.step = 3  # pyright: ignore[reportAttributeAccessIssue]  # assigning a frozen field on purpose
    replaced = dataclasses.replace(new, step=jnp.asarray(7, jnp.int32))
    assert int(replaced.step) == 7 and int(new.step) == 1
    assert jnp.issubdtype(new.key.dtype, jax.dtypes.prng_key)


def test_create_copies_params_so_donation_never_deletes_the_callers_arrays(key):
    params = init_params(key)
    tx = optim.sgd(0.1)
    state = TrainState.create(params, tx, 0)
    make_train_step(loss_fn)(state, make_data(key, 8))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(params))


def test_create_validation(key):
    with pytest.raises(TypeError, match=r"`tx` \(the optimizer\) must have `init` and `update`"):
        TrainState.create(init_params(key), object(), 0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="key"):
        TrainState.create(init_params(key), optim.sgd(0.1), "seed")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="hashable"):
        SizedState.create(init_params(key), optim.sgd(0.1), 0, hidden=[1, 2])
    with pytest.raises(ValueError, match="no array leaves"):
        TrainState.create({}, optim.sgd(0.1), 0)
    raw = TrainState.create(init_params(key), optim.sgd(0.1), jax.random.PRNGKey(3))
    assert jnp.issubdtype(raw.key.dtype, jax.dtypes.prng_key)


def test_static_field_change_recompiles_exactly_once_more(setup):
    tx, state, (x, y) = setup
    batch = (x[:32], y[:32])
    step = make_train_step(loss_fn)
    state = SizedState(**vars(state))  # a subclass with a static field, `hidden`
    with CompileBudget(2, step, exact=True) as budget:
        state, _ = step(state, batch)
        state, _ = step(state, batch)
        state = dataclasses.replace(state, hidden=(8,))
        state, _ = step(state, batch)
        state, _ = step(state, batch)
    explanation = budget.records[1].explanation
    assert budget.count == 2 and explanation is not None and explanation.kind == "structure"


# ---------------------------------------------------------------------------
# Donation
# ---------------------------------------------------------------------------


def test_donation_deletes_old_state_not_batch(setup):
    tx, state, (x, y) = setup
    batch = (x[:32], y[:32])
    old_leaves = jax.tree.leaves(state)
    new, metrics = make_train_step(loss_fn)(state, batch)
    assert all(leaf.is_deleted() for leaf in old_leaves)
    assert not any(leaf.is_deleted() for leaf in batch)
    assert set(metrics) == {"loss", "grad_norm", "skipped"}


def test_check_donatable_catches_shared_zeros(key):
    params = init_params(key)
    zeros = jax.tree.map(jnp.zeros_like, params)
    shared = optim.ScaleByAdamState(
        count=jnp.zeros((), jnp.int32), mu=zeros, nu=zeros
    )  # the classic bug
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=(shared, optax.EmptyState()),
        key=jax.random.key(0),
    )
    with pytest.raises(
        DonationError, match=r"`opt_state.0.mu.dense_0.b` and `opt_state.0.nu.dense_0.b`"
    ):
        check_donatable(state)
    step = make_train_step(loss_fn)
    with pytest.raises(DonationError, match="same buffer"):
        step(state, make_data(key, 8))
    assert not any(
        leaf.is_deleted() for leaf in jax.tree.leaves(state)
    )  # the user's state survives


def test_reusing_a_donated_state_is_a_clear_error(setup):
    tx, state, (x, y) = setup
    step = make_train_step(loss_fn)
    step(state, (x[:8], y[:8]))
    fresh = make_train_step(loss_fn)
    with pytest.raises(DonationError, match="already deleted"):
        fresh(state, (x[:8], y[:8]))


def test_host_copy_survives_donation_device_reference_does_not(setup):
    tx, state, (x, y) = setup
    kept = state.params["dense_0"]["w"]
    snapshot = host_copy(state.params)
    make_train_step(loss_fn)(state, (x[:8], y[:8]))
    assert kept.is_deleted()
    assert (
        isinstance(snapshot["dense_0"]["w"], np.ndarray)
        and np.isfinite(snapshot["dense_0"]["w"]).all()
    )


@pytest.mark.parametrize("guard", ["cpu", "tpu"], ids=["branching", "select"])
def test_weak_typed_leaf_is_caught_by_the_audit(key, guard):
    params = {
        "dense_0": {"w": jnp.ones((4, 3)), "b": jnp.asarray(0.0)}
    }  # jnp.asarray(0.0) is weakly typed

    def loss(p, batch):
        return jnp.mean((batch[0] @ p["dense_0"]["w"] + p["dense_0"]["b"]) ** 2)

    tx = optim.sgd(0.1)
    state = TrainState(
        step=jnp.zeros((), jnp.int32),
        params=params,
        opt_state=tx.init(params),
        key=jax.random.key(0),
        tx=tx,
    )
    # both NaN guards keep the weak type stable: lax.cond (CPU, GPU) and the selects (TPU)
    with assume_backend(guard):
        guarded, _ = make_train_step(loss)(state, (jnp.ones((2, 4)), None))
    assert type_signature(guarded) == type_signature(state)
    params = {"dense_0": {"w": jnp.ones((4, 3)), "b": jnp.asarray(0.0)}}
    fixed = TrainState.create(params, tx, 0)  # create() gives strong types
    make_train_step(loss)(fixed, (jnp.ones((2, 4)), None))


def test_24_steps_over_8_batches_compile_once(setup):
    tx, state, (x, y) = setup
    batches = [(x[i * 12 : (i + 1) * 12], y[i * 12 : (i + 1) * 12]) for i in range(8)]
    step = make_train_step(loss_fn)
    with CompileBudget(1, step, exact=True):
        for i in range(24):
            state, metrics = step(state, batches[i % 8])
    assert int(state.step) == 24


# ---------------------------------------------------------------------------
# NaN guard
# ---------------------------------------------------------------------------


def test_poisoned_batch_leaves_state_bit_identical(setup):
    tx, state, (x, y) = setup
    step = make_train_step(loss_fn)
    state, _ = step(state, (x[:16], y[:16]))
    before = host_copy(state)
    poisoned = (x[:16].at[3, 1].set(jnp.nan), y[:16])
    after, metrics = step(state, poisoned)
    assert int(metrics["skipped"]) == 1 and not np.isfinite(float(metrics["loss"]))
    for a, b in zip(jax.tree.leaves(host_copy(after)), jax.tree.leaves(before)):
        assert a.tobytes() == b.tobytes()
    after, metrics = step(after, (x[16:32], y[16:32]))
    assert int(metrics["skipped"]) == 0 and int(after.step) == 2


# ---------------------------------------------------------------------------
# Epochs
# ---------------------------------------------------------------------------


def test_epoch_compiles_once_and_drops_remainder(setup):
    tx, state, data = setup
    epoch = make_train_epoch(loss_fn, 20)  # 96 = 4 × 20 + 16 dropped
    with CompileBudget(1, epoch, exact=True):
        for _ in range(5):
            state, metrics = epoch(state, data)
    assert metrics["loss"].shape == (4,) and int(state.step) == 20  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    assert float(metrics["loss"][-1]) < 1.0  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs


def test_epoch_equals_steps_over_the_same_permutation(setup):
    tx, state, data = setup
    twin = jax.tree.map(lambda a: jnp.array(a, copy=True), state)
    epoch_state, metrics = make_train_epoch(loss_fn, 32)(state, data)
    order = np.asarray(jnp.argsort(shuffle_hash(twin.key, twin.step, 96)))[:96].reshape(3, 32)
    assert sorted(order.ravel().tolist()) == list(range(96))  # a permutation
    step = make_train_step(loss_fn)
    losses = []
    for idx in order:
        twin, m = step(twin, (data[0][idx], data[1][idx]))
        losses.append(float(m["loss"]))
    np.testing.assert_allclose(np.asarray(metrics["loss"]), losses, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(epoch_state.params), jax.tree.leaves(twin.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    # the epoch does not consume the key (the hash shuffle needs none): it is carried unchanged
    assert np.array_equal(jax.random.key_data(epoch_state.key), jax.random.key_data(twin.key))


def _row_gathers(jaxpr, n: int) -> list[str]:
    """The ``mode`` of every ``gather`` of rows from an ``(n, ...)`` operand (the data's leaves)
    in ``jaxpr`` and its sub-jaxprs (scan, cond bodies); the loss's own gathers are smaller."""
    modes = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "gather" and eqn.invars[0].aval.shape[:1] == (n,):
            modes.append(str(eqn.params["mode"]).rsplit(".", 1)[-1])
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    modes += _row_gathers(inner, n)
    return modes


def test_a_maskless_epoch_gathers_in_bounds_and_a_padded_one_reads_zeros_at_its_padding(setup):
    """A shuffle epoch's indices are all real rows: its batch is the plain (clamping) gather,
    no select over the batch; a Poisson epoch pads with the index ``n``: a ``fill`` gather."""
    tx, state, data = setup
    gradient = jaxwise.train.value_and_grad(loss_fn)
    shuffle = jaxwise.train.make_epoch(gradient, jaxwise.train.ShuffleSampler(32))
    modes = _row_gathers(jax.make_jaxpr(shuffle.jitted)(state, data).jaxpr, 96)
    assert modes == ["PROMISE_IN_BOUNDS"] * 2, modes  # x and y

    def example_loss(params, example):
        x, y = example
        return loss_fn(params, (x[None], y[None]))

    dp = jaxwise.privacy.dp_gradient_fn(example_loss, clip_norm=1.0, noise_multiplier=0.0)
    poisson = jaxwise.train.make_epoch(dp, jaxwise.train.PoissonSampler(32))
    modes = _row_gathers(jax.make_jaxpr(poisson.jitted)(state, data).jaxpr, 96)
    assert modes and set(modes) == {"FILL_OR_DROP"}, modes


def test_shuffle_is_uniform_and_changes_every_epoch():
    """Position-0 counts over 2000 epochs of n=10: chi-square against uniform (df=9)."""
    key = jax.random.key(7)
    hashes = jax.vmap(lambda s: shuffle_hash(key, s, 10))(jnp.arange(0, 20000, 10))
    orders = np.argsort(np.asarray(hashes), axis=1)
    counts = np.bincount(orders[:, 0], minlength=10)
    chi2 = float(((counts - 200.0) ** 2 / 200.0).sum())
    assert chi2 < 27.9, counts  # p = 0.001 for 9 degrees of freedom
    pairs = np.bincount(orders[:, 0] * 10 + orders[:, 1], minlength=100).reshape(10, 10)
    assert np.all(np.diag(pairs) == 0) and pairs.sum() == 2000
    assert len({tuple(o) for o in orders}) > 1990  # (almost) every epoch its own order
    other = np.argsort(np.asarray(shuffle_hash(jax.random.key(8), jnp.int32(0), 10)))
    assert not np.array_equal(other, orders[0])


def test_epoch_bad_input(setup):
    tx, state, (x, y) = setup
    with pytest.raises(ValueError, match="larger than the dataset"):
        make_train_epoch(loss_fn, 200)(state, (x, y))
    with pytest.raises(ValueError, match=r"share their leading .* `0`: 96, `1`: 95"):
        make_train_epoch(loss_fn, 8)(state, (x, y[:95]))
    with pytest.raises(ValueError, match=r"`data` leaf `1` is a scalar"):
        make_train_epoch(loss_fn, 8)(state, (x, jnp.float32(1.0)))
    with pytest.raises(ValueError, match="`data` has no arrays"):
        make_train_epoch(loss_fn, 8)(state, ())
    with pytest.raises(ValueError, match="batch_size"):
        make_train_epoch(loss_fn, 0)
    with pytest.raises(TypeError, match="`loss`"):
        make_train_step("loss")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))


def test_has_aux_and_with_key(setup):
    tx, state, (x, y) = setup

    def loss_aux(params, batch, key):
        noise = 0.01 * jax.random.normal(key, batch[0].shape)
        logits = apply(params, batch[0] + noise)
        return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch[1])), {
            "acc": jnp.mean((logits.argmax(-1) == batch[1]).astype(jnp.float32))
        }

    step = make_train_step(loss_aux, has_aux=True, with_key=True)
    key_before = jax.random.key_data(state.key).copy()
    state, metrics = step(state, (x[:16], y[:16]))
    assert 0.0 <= float(metrics["aux"]["acc"]) <= 1.0
    assert not np.array_equal(np.asarray(jax.random.key_data(state.key)), np.asarray(key_before))


# ---------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SizedState(TrainState):
    """Configuration as a static field of a subclass (``TrainState`` has no ``config``)."""

    hidden: tuple[int, ...] = dataclasses.field(default=(), metadata=dict(static=True))


def test_checkpoint_roundtrip_with_typed_key_and_static(tmp_path, key):
    tx = optim.adam(1e-3)
    state = SizedState.create(init_params(key), tx, jax.random.key(5), hidden=(16,))
    save(tmp_path / "ck", state, {"epoch": 3, "note": "hello"})
    restored = restore(tmp_path / "ck", like=state)
    for a, b in zip(jax.tree.leaves(host_copy(restored)), jax.tree.leaves(host_copy(state))):
        assert a.tobytes() == b.tobytes()
    assert jnp.issubdtype(restored.key.dtype, jax.dtypes.prng_key)
    assert restored.hidden == state.hidden == (16,)
    assert type_signature(restored) == type_signature(state)
    assert load_metadata(tmp_path / "ck") == {"epoch": 3, "note": "hello"}
    assert latest_step(tmp_path / "ck") == 0
    with pytest.raises(CheckpointError, match="already exists"):
        save(tmp_path / "ck", state)


def test_restore_errors_name_the_problem(tmp_path, key):
    tx = optim.adam(1e-3)
    state = SizedState.create(init_params(key), tx, 0, hidden=(16,))
    save(tmp_path / "ck", state)
    other = SizedState.create(init_params(key, sizes=(4, 8, 3)), tx, 0, hidden=(16,))
    with pytest.raises(
        CheckpointError,
        match=r"at `params.dense_0.b`: checkpoint float32\[16\], `like` float32\[8\]",
    ):
        restore(tmp_path / "ck", like=other)
    renamed = SizedState.create({"layer": init_params(key)["dense_0"]}, tx, 0, hidden=(16,))
    with pytest.raises(CheckpointError, match="first differing path"):
        restore(tmp_path / "ck", like=renamed)
    with pytest.raises(CheckpointError, match="static `hidden`"):
        restore(tmp_path / "ck", like=SizedState.create(init_params(key), tx, 0, hidden=(32,)))
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        restore(tmp_path / "missing", like=state)
    with pytest.raises(CheckpointError, match="no checkpoint for step 9"):
        restore(tmp_path / "ck", like=state, step=9)


def test_corrupted_checkpoint_is_detected(tmp_path, key):
    state = TrainState.create(init_params(key), optim.sgd(0.1), 0)
    directory = save(tmp_path / "ck", state)
    data_files = sorted(
        (p for p in directory.rglob("*") if p.is_file()), key=lambda p: -p.stat().st_size
    )
    target = data_files[0]
    blob = bytearray(target.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    target.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="corrupted"):
        restore(tmp_path / "ck", like=state)


def test_interrupted_write_keeps_previous_checkpoint(tmp_path, key):
    tx = optim.sgd(0.1)
    state = TrainState.create(init_params(key), tx, 0)
    save(tmp_path / "ck", state)
    # A write that died half-way leaves only an uncommitted temporary directory.
    partial = tmp_path / "ck" / "5.orbax-checkpoint-tmp-1234"
    partial.mkdir()
    (partial / "garbage").write_bytes(b"\0" * 100)
    assert latest_step(tmp_path / "ck") == 0
    restored = restore(tmp_path / "ck", like=state)
    assert int(restored.step) == 0


RESUME_SCRIPT = textwrap.dedent(
    """
    import sys, numpy as np, jax, jax.numpy as jnp
    sys.path.insert(0, {tests!r})
    from test_train import init_params, loss_fn, make_data
    from jaxwise import optim
    from jaxwise.checkpoint import restore, save
    from jaxwise.train import TrainState, make_train_epoch
    mode, path, out = sys.argv[1], sys.argv[2], sys.argv[3]
    tx = optim.adamw(1e-2, weight_decay=1e-3)
    data = make_data(jax.random.key(2))
    epoch = make_train_epoch(loss_fn, batch_size=16)
    state = TrainState.create(init_params(jax.random.key(0)), tx, jax.random.key(1))
    if mode == "first":  # 2 epochs, saved, then on without stopping: the straight run
        for _ in range(2):
            state, _ = epoch(state, data)
        save(path, state)
        for _ in range(4):
            state, _ = epoch(state, data)
    else:  # another process: restored, then the same 4 epochs
        state = restore(path, like=state)
        for _ in range(4):
            state, _ = epoch(state, data)
    is_key = lambda l: jnp.issubdtype(l.dtype, jax.dtypes.prng_key)
    leaves = [np.asarray(jax.random.key_data(l) if is_key(l) else l)
              for l in jax.tree.leaves(state)]
    np.savez(out, *leaves)
    """
)


@pytest.mark.slow  # two subprocesses: runs in the newest lane (make test), not the oldest
def test_resume_is_bit_identical_across_processes(tmp_path):
    script = tmp_path / "resume.py"
    script.write_text(RESUME_SCRIPT.format(tests=str(Path(__file__).parent)))
    env = dict(os.environ, JAX_PLATFORMS="cpu")

    def run(mode, out):
        proc = subprocess.run(
            [sys.executable, str(script), mode, str(tmp_path / "ck"), str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        return np.load(out)

    straight = run("first", tmp_path / "a.npz")  # saves at epoch 2, runs on to epoch 6
    resumed = run("resume", tmp_path / "c.npz")
    assert len(straight.files) == len(resumed.files)
    for name in straight.files:
        assert straight[name].tobytes() == resumed[name].tobytes(), name


# ---------------------------------------------------------------------------
# Data parallelism on 4 fake CPU devices
# ---------------------------------------------------------------------------


def test_data_parallel_equals_single_device(key):
    assert len(mesh_devices(4)) == 4
    mesh = data_mesh(mesh_devices(4))
    tx = optim.adam(1e-2)
    params = init_params(key)
    data = make_data(jax.random.key(2), n=128)
    single = make_train_step(loss_fn)
    parallel = make_train_step(loss_fn, mesh=mesh)
    s1, s4 = TrainState.create(params, tx, 0), TrainState.create(params, tx, 0)
    # the single-device run on the mesh's platform (a TPU machine's mesh of 4 is its CPU's):
    # one backend's arithmetic on both sides
    s1 = jax.device_put(s1, mesh.devices.flat[0])
    for i in range(4):
        batch = (data[0][i * 32 : (i + 1) * 32], data[1][i * 32 : (i + 1) * 32])
        s1, m1 = single(s1, jax.device_put(batch, mesh.devices.flat[0]))
        s4, m4 = parallel(s4, batch)
        np.testing.assert_allclose(float(m4["loss"]), float(m1["loss"]), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(s4.params), jax.tree.leaves(s1.params)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    placed = jax.device_put(batch, parallel.batch_sharding)  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    assert placed[0].addressable_shards[0].data.shape == (8, 4)
    compiled = parallel.jitted.lower(s4, placed).compile()
    batch_sharding = jax.tree.leaves(compiled.input_shardings[0][1])[0]
    assert batch_sharding.spec == P("data") and len(batch_sharding.device_set) == 4
    assert s4.params["dense_0"]["w"].sharding.is_fully_replicated


def test_data_parallel_epoch_and_bad_batch(key):
    mesh = data_mesh(mesh_devices(4))
    tx = optim.sgd(0.1)
    data = make_data(jax.random.key(2), n=128)
    e1 = make_train_epoch(loss_fn, 32)
    e4 = make_train_epoch(loss_fn, 32, mesh=mesh)
    s1, m1 = e1(TrainState.create(init_params(key), tx, 0), data)
    s4, m4 = e4(TrainState.create(init_params(key), tx, 0), data)
    np.testing.assert_allclose(np.asarray(m4["loss"]), np.asarray(m1["loss"]), rtol=1e-5)
    with pytest.raises(ValueError, match="not divisible by the 4 devices"):
        make_train_epoch(loss_fn, 30, mesh=mesh)
    step = make_train_step(loss_fn, mesh=mesh)
    with pytest.raises(ValueError, match="global batch size 30 is not divisible"):
        step(TrainState.create(init_params(key), tx, 0), (data[0][:30], data[1][:30]))
    with pytest.raises(ValueError, match="'data'"):
        make_train_step(loss_fn, mesh=jax.sharding.Mesh(np.asarray(mesh_devices(2)), ("batch",)))


# ---------------------------------------------------------------------------
# Model state (BatchNorm-like running statistics)
# ---------------------------------------------------------------------------


def bn_init(key, sizes=(4, 16, 3)):
    params = init_params(key, sizes)
    params["scale"], params["shift"] = jnp.ones(sizes[1]), jnp.zeros(sizes[1])
    stats = {
        "mean": jnp.zeros(sizes[1]),
        "var": jnp.ones(sizes[1]),
        "count": jnp.zeros((), jnp.int32),
    }
    return params, stats


def bn_apply(params, stats, x, train):
    h = x @ params["dense_0"]["w"] + params["dense_0"]["b"]
    if train:
        mean, var = jnp.mean(h, axis=0), jnp.var(h, axis=0)
        new = {
            "mean": 0.9 * stats["mean"] + 0.1 * mean,
            "var": 0.9 * stats["var"] + 0.1 * var,
            "count": stats["count"] + 1,
        }
    else:
        mean, var, new = stats["mean"], stats["var"], stats
    h = (h - mean) / jnp.sqrt(var + 1e-5) * params["scale"] + params["shift"]
    return jnp.tanh(h) @ params["dense_1"]["w"] + params["dense_1"]["b"], new


def bn_loss(params, stats, batch):
    logits, new = bn_apply(params, stats, batch[0], True)
    return jnp.mean(optax.softmax_cross_entropy_with_integer_labels(logits, batch[1])), new


def test_model_state_step_and_epoch_compile_once_and_update_statistics(key):
    params, stats = bn_init(key)
    tx = optim.adam(1e-2)
    data = make_data(jax.random.key(2))
    state = TrainState.create(params, tx, 1, model_state=stats)
    assert (
        state.model_state["count"].dtype == jnp.int32
        and state.model_state["mean"] is not stats["mean"]
    )
    step = make_train_step(bn_loss, model_state=True)
    with CompileBudget(1, step, exact=True):
        for i in range(3):
            state, metrics = step(
                state, (data[0][i * 16 : (i + 1) * 16], data[1][i * 16 : (i + 1) * 16])
            )
    assert int(state.model_state["count"]) == 3 and int(metrics["skipped"]) == 0  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    assert not np.allclose(np.asarray(state.model_state["mean"]), 0.0)
    epoch = make_train_epoch(bn_loss, 32, model_state=True)
    with CompileBudget(1, epoch, exact=True):
        for _ in range(2):
            state, metrics = epoch(state, data)
    assert int(state.model_state["count"]) == 3 + 6 and metrics["loss"].shape == (3,)  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs


def test_model_state_matches_a_float64_running_average(key):
    params, stats = bn_init(key)
    tx = optim.sgd(0.0)  # parameters fixed: only the statistics move
    state = TrainState.create(params, tx, 1, model_state=stats)
    step = make_train_step(bn_loss, model_state=True)
    x, y = make_data(jax.random.key(2))
    w, b = (np.asarray(params["dense_0"][k], np.float64) for k in ("w", "b"))
    mean = np.zeros(16)
    for i in range(4):
        xb = x[i * 24 : (i + 1) * 24]
        state, _ = step(state, (xb, y[i * 24 : (i + 1) * 24]))
        mean = 0.9 * mean + 0.1 * (np.asarray(xb, np.float64) @ w + b).mean(axis=0)
    np.testing.assert_allclose(np.asarray(state.model_state["mean"]), mean, rtol=1e-5, atol=1e-6)


def test_nan_batch_leaves_params_and_model_state_bit_identical(key):
    params, stats = bn_init(key)
    tx = optim.adam(1e-2)
    x, y = make_data(jax.random.key(2))
    state = TrainState.create(params, tx, 1, model_state=stats)
    step = make_train_step(bn_loss, model_state=True)
    state, _ = step(state, (x[:16], y[:16]))
    before = host_copy(state)
    after, metrics = step(state, (x[16:32].at[2, 0].set(jnp.nan), y[16:32]))
    assert int(metrics["skipped"]) == 1
    for a, b in zip(jax.tree.leaves(host_copy(after)), jax.tree.leaves(before), strict=True):
        assert a.tobytes() == b.tobytes()
    assert int(after.model_state["count"]) == 1


def test_model_state_with_aux(key):
    params, stats = bn_init(key)
    tx = optim.sgd(0.1)

    def loss(p, s, batch):
        value, new = bn_loss(p, s, batch)
        return value, (new, {"twice": 2 * value})

    state = TrainState.create(params, tx, 0, model_state=stats)
    state, metrics = make_train_step(loss, model_state=True, has_aux=True)(
        state, make_data(key, 16)
    )
    np.testing.assert_allclose(
        float(metrics["aux"]["twice"]), 2 * float(metrics["loss"]), rtol=1e-6
    )
    assert int(state.model_state["count"]) == 1


# ---------------------------------------------------------------------------
# Bad input: one clear error each, state never donated
# ---------------------------------------------------------------------------


def test_model_state_loss_returning_a_bare_scalar_is_a_clear_error(key):
    params, stats = bn_init(key)
    tx = optim.sgd(0.1)
    state = TrainState.create(params, tx, 0, model_state=stats)

    def scalar_loss(p, s, batch):
        return bn_loss(p, s, batch)[0]

    with pytest.raises(
        TypeError,
        match=r"`scalar_loss` with model_state=True must return \(loss, new_model_state\)"
        r", got a bare array of shape \(\)",
    ):
        make_train_step(scalar_loss, model_state=True)(state, make_data(key, 8))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))


def test_flax_train_state_is_rejected_with_the_fix(key):
    from flax.training import train_state

    tx = optim.sgd(0.1)
    flax_state = train_state.TrainState.create(apply_fn=apply, params=init_params(key), tx=tx)
    with pytest.raises(
        TypeError,
        match=r"`state` must be a jaxwise.train.TrainState .* got "
        r"flax.training.train_state.TrainState; .*TrainState.create\(flax_state.params",
    ):
        make_train_step(loss_fn)(flax_state, make_data(key, 8))  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="`state` must be a jaxwise.train.TrainState"):
        make_train_epoch(loss_fn, 4)({"params": init_params(key)}, make_data(key, 8))  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_model_objects_are_rejected_as_params(key):
    import equinox as eqx
    import flax.linen as nn
    from flax import nnx

    tx = optim.sgd(0.1)
    with pytest.raises(
        TypeError,
        match=r"`params` must be a pytree of arrays, got the flax.nnx model object "
        r"Linear; .*jaxwise.models.from_nnx\(module\)",
    ):
        TrainState.create(nnx.Linear(2, 3, rngs=nnx.Rngs(0)), tx, 0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(
        TypeError, match=r"flax.linen model object Dense; .*from_linen\(module, variables\)"
    ):
        TrainState.create(nn.Dense(3), tx, 0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    mlp = eqx.nn.MLP(
        2, 3, 8, 1, key=jax.random.key(0)
    )  # holds its activation function: not a params tree
    with pytest.raises(TypeError, match=r"equinox model object MLP; .*from_equinox\(module\)"):
        TrainState.create(mlp, tx, 0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    linear = eqx.nn.Linear(2, 3, key=jax.random.key(0))  # arrays only: a valid parameter pytree
    assert TrainState.create(linear, tx, 0).params.weight.shape == (3, 2)  # pyright: ignore[reportArgumentType]  # bad input on purpose


def test_step_options_are_validated_before_tracing():
    with pytest.raises(TypeError, match="`loss` must be callable"):
        make_train_step("loss")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="`gradient` must be a gradient function"):
        jaxwise.train.make_step("gradient")  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="`sampler` must be a jaxwise.train.Sampler"):
        jaxwise.train.make_epoch(jaxwise.train.value_and_grad(loss_fn), 8)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(TypeError, match="`state` has no optimizer"):
        bare = TrainState(jnp.zeros((), jnp.int32), {"w": jnp.ones(2)}, (), jax.random.key(0))
        make_train_step(lambda p, b: jnp.sum(p["w"] * b))(bare, jnp.ones(2))
    with pytest.raises(TypeError, match="`compute_dtype`"):
        jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_fn), compute_dtype=jnp.int32
            )
        )
    with pytest.raises(ValueError, match="needs loss scaling"):
        jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_fn), compute_dtype=jnp.float16
            )
        )
    with pytest.raises(ValueError, match='`loss_scale` must be None, "dynamic"'):
        jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_fn), compute_dtype=jnp.bfloat16, loss_scale="auto"
            )
        )  # pyright: ignore[reportArgumentType]  # bad input on purpose
    with pytest.raises(ValueError, match="`loss_scale` must be > 0"):
        jaxwise.train.make_step(
            jaxwise.train.mixed_precision(
                jaxwise.train.value_and_grad(loss_fn), compute_dtype=jnp.bfloat16, loss_scale=-1.0
            )
        )
    with pytest.raises(TypeError, match="`batch_size` must be an int"):
        make_train_epoch(loss_fn, 8.0)  # pyright: ignore[reportArgumentType]  # bad input on purpose
    assert make_train_epoch(loss_fn, np.int64(8)).sampler == jaxwise.train.ShuffleSampler(8)


# ---------------------------------------------------------------------------
# Optimizer mismatch
# ---------------------------------------------------------------------------


def test_optimizer_mismatch_is_caught_before_donation(key):
    params = init_params(key)
    # a state whose optimizer was swapped for one that builds another state
    state = TrainState.create(params, optim.adam(1e-3), 0).replace(tx=optim.sgd(0.1))
    step = make_train_step(loss_fn)
    with pytest.raises(
        ValueError,
        match=r"does not fit the state's `opt_state` .* the state holds "
        r"\(ScaleByAdamState, EmptyState\), the optimizer builds "
        r"\(EmptyState, EmptyState\)",
    ):
        step(state, make_data(key, 8))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    epoch = make_train_epoch(loss_fn, 4)
    with pytest.raises(ValueError, match="does not fit"):
        epoch(state, make_data(key, 8))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    # same structure, other shapes: a state built for other parameters
    other = TrainState.create(init_params(key, (4, 8, 3)), optim.adam(1e-3), 0)
    with pytest.raises(
        ValueError,
        match=r"at `opt_state.0.mu.dense_0.b`: the state has float32\[8\], the "
        r"optimizer builds float32\[16\]",
    ):
        check_optimizer_fits(optim.adam(1e-3), params, other.opt_state)
    # Optax's own adam and jaxwise's build the same state: accepted
    with jax.numpy_dtype_promotion("standard"):
        make_train_step(loss_fn)(state.replace(tx=optax.adam(1e-3)), make_data(key, 8))


# ---------------------------------------------------------------------------
# Donation verified on every call
# ---------------------------------------------------------------------------


def test_live_numpy_view_is_caught_on_a_later_call(setup):
    # on the host CPU whatever the backend: only there does a NumPy view share the buffer
    tx, state, (x, y) = setup
    state, x, y = jax.device_put((state, x, y), cpu_devices()[0])
    step = make_train_step(loss_fn)
    state, _ = step(state, (x[:8], y[:8]))  # first call: audited as before
    view = np.asarray(
        state.params["dense_0"]["w"]
    )  # a live view pins the buffer: donation silently skipped
    with pytest.raises(
        DonationError,
        match=r"the donated state leaf `params.dense_0.w` kept its buffer .* "
        r"live NumPy view: .* `jaxwise.tree.host_copy",
    ) as info:
        step(state, (x[8:16], y[8:16]))
    new_state, metrics = info.value.result  # the call's result is kept
    assert int(new_state.step) == 2 and int(metrics["skipped"]) == 0
    del view
    snapshot = host_copy(new_state.params)  # the fix: a real copy
    new_state, _ = step(new_state, (x[16:24], y[16:24]))
    assert int(new_state.step) == 3 and snapshot["dense_0"]["w"].shape == (4, 16)


def test_state_copied_to_the_programs_devices_is_not_a_kept_buffer():
    # a loss in shard_map over a mesh of other devices (on a TPU machine: the CPU's): JAX copies
    # the uncommitted state there and donates the copy; the original is the caller's, no error
    from jax.sharding import Mesh

    devices = cpu_devices()[4:8]
    mesh = Mesh(np.asarray(devices), ("data",))

    def body(p, x, y):
        return jax.lax.pmean(jnp.mean((x @ p["w"] - y) ** 2), "data")

    def loss(p, batch):
        spec = (P(), P("data"), P("data"))
        return jax.shard_map(body, mesh=mesh, in_specs=spec, out_specs=P())(p, *batch)

    with jax.default_device(cpu_devices()[0]):
        state = TrainState.create({"w": jnp.ones((3, 1))}, optim.sgd(0.1), 0)
        batch = (jnp.ones((8, 3)), jnp.ones((8, 1)))
    step = make_train_step(loss)
    with CompileBudget(2, step, exact=True):  # the state's placement changes once: 2
        moved, _ = step(state, batch)  # copied: the original stays alive
        assert not state.params["w"].is_deleted()
        assert moved.params["w"].devices() == set(devices)
        again, _ = step(moved, batch)  # on the mesh now: donated in place
    assert moved.params["w"].is_deleted() and int(again.step) == 2


def test_deleted_leaf_is_named_on_every_call(setup):
    tx, state, (x, y) = setup
    step = make_train_step(loss_fn)
    old = state
    state, _ = step(state, (x[:8], y[:8]))
    state, _ = step(state, (x[8:16], y[8:16]))
    with pytest.raises(DonationError, match=r"the array at `step` was already deleted"):
        step(old, (x[:8], y[:8]))
    partial = dataclasses.replace(state, model_state={"stale": old.params["dense_0"]["b"]})
    with pytest.raises(
        DonationError, match=r"the array at `model_state.stale` was already deleted"
    ):
        step(partial, (x[:8], y[:8]))
    epoch = make_train_epoch(loss_fn, 8)
    state, _ = epoch(state, (x, y))
    with pytest.raises(DonationError, match="already deleted"):
        epoch(old, (x, y))


def test_batch_that_is_part_of_the_state_names_both_paths(key):
    tx = optim.sgd(0.1)
    params = {"w": jnp.ones((3, 3))}

    def loss(p, batch):
        return jnp.sum((batch["w"] @ p["w"]) ** 2)

    state = TrainState.create(params, tx, 0)
    step = make_train_step(loss)
    with pytest.raises(DonationError, match=r"`batch` leaf `w` is the state leaf `params.w`"):
        step(state, state.params)
    state, _ = step(state, {"w": jnp.ones((2, 3))})
    with pytest.raises(DonationError, match=r"`batch` leaf `w` is the state leaf `params.w`"):
        step(state, state.params)  # also after the first call
    assert not state.params["w"].is_deleted()
    epoch = make_train_epoch(lambda p, b: jnp.sum(b[0] @ p["w"]), 3)
    with pytest.raises(DonationError, match=r"`data` leaf `0` is the state leaf `params.w`"):
        epoch(state, (state.params["w"],))


def test_program_names_come_from_the_loss_function(setup):
    tx, state, data = setup
    step = make_train_step(loss_fn)
    epoch = make_train_epoch(loss_fn, 32)
    assert (
        step.jitted.__name__ == "loss_fn_train_step"  # pyright: ignore[reportAttributeAccessIssue]  # jit copies __name__ at run time
        and epoch.jitted.__name__ == "loss_fn_train_epoch"  # pyright: ignore[reportAttributeAccessIssue]  # jit copies __name__ at run time
    )
    with CompileBudget(1, "loss_fn_train_epoch", exact=True):
        state, _ = epoch(state, data)
        state, _ = epoch(state, data)


# ---------------------------------------------------------------------------
# The NaN guard guards the update too
# ---------------------------------------------------------------------------


def test_nan_update_from_a_finite_gradient_is_skipped(key):
    tx = optax.adam(1e-2, eps=0.0)  # a zero gradient gives 0 / (sqrt(0) + 0) = NaN updates

    def flat_loss(params, batch):
        return jnp.sum(params["w"] * 0.0) + jnp.mean(batch)

    state = TrainState.create({"w": jnp.ones(3)}, tx, 0)
    step = make_train_step(flat_loss)
    before = host_copy(state)
    with jax.numpy_dtype_promotion("standard"):  # Optax relies on standard promotion
        after, metrics = step(state, jnp.ones(4))
    assert float(metrics["grad_norm"]) == 0.0 and np.isfinite(float(metrics["loss"]))
    assert int(metrics["skipped"]) == 1
    for a, b in zip(jax.tree.leaves(host_copy(after)), jax.tree.leaves(before), strict=True):
        assert a.tobytes() == b.tobytes()


# ---------------------------------------------------------------------------
# A Flax NNX model with BatchNorm, through jaxwise.models.from_nnx
# ---------------------------------------------------------------------------


def _nnx_net():
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.dense = nnx.Linear(4, 16, rngs=rngs)
            self.norm = nnx.BatchNorm(16, momentum=0.9, rngs=rngs)
            self.out = nnx.Linear(16, 3, rngs=rngs)

        def __call__(self, x):
            return self.out(jnp.tanh(self.norm(self.dense(x))))

    return Net(nnx.Rngs(0))


@pytest.mark.parametrize("kind", ["step", "epoch"])
def test_nnx_batchnorm_trains_with_model_state(kind):
    from flax import nnx

    from jaxwise.models import from_nnx

    net = _nnx_net()
    model = from_nnx(net)

    def nnx_loss(params, model_state, batch):
        logits, new_state = model.apply(params, model_state, batch[0])
        return jnp.mean(
            optax.softmax_cross_entropy_with_integer_labels(logits, batch[1])
        ), new_state

    tx = optim.adam(1e-2)
    data = make_data(jax.random.key(2))
    state = TrainState.create(model.params, tx, 1, model_state=model.model_state)
    stats_before = host_copy(state.model_state)
    if kind == "step":
        program = make_train_step(nnx_loss, model_state=True)
        batches = [
            (data[0][i * 32 : (i + 1) * 32], data[1][i * 32 : (i + 1) * 32]) for i in range(3)
        ] * 2
    else:
        program = make_train_epoch(nnx_loss, 32, model_state=True)
        batches = [data] * 2
    with CompileBudget(1, program, exact=True):
        for batch in batches:
            state, metrics = program(state, batch)
    assert int(state.step) == 6 and int(np.sum(metrics["skipped"])) == 0  # pyright: ignore[reportPossiblyUnboundVariable]  # the loop above runs
    for before, after in zip(
        jax.tree.leaves(stats_before), jax.tree.leaves(state.model_state), strict=True
    ):
        assert not np.allclose(before, np.asarray(after))  # running mean and variance moved
    # eval mode: our state merged into the NNX module gives the same outputs as its eval view
    trained = nnx.merge(nnx.graphdef(net), state.params, state.model_state)
    trained.eval()
    expected = trained(data[0])
    eval_model = from_nnx(nnx.view(net, use_running_average=True))
    out, _ = eval_model.apply(state.params, state.model_state, data[0])
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), rtol=1e-6, atol=1e-6)

    # a NaN batch leaves params and running statistics bit-identical
    step = make_train_step(nnx_loss, model_state=True)
    snapshot = host_copy(state)
    state, metrics = step(state, (data[0][:32].at[0, 0].set(jnp.nan), data[1][:32]))
    assert int(metrics["skipped"]) == 1
    for a, b in zip(jax.tree.leaves(host_copy(state)), jax.tree.leaves(snapshot), strict=True):
        assert a.tobytes() == b.tobytes()


def test_create_compiles_one_program_for_any_number_of_states(key):
    from jaxwise.train._program._state import _build_jit

    params, stats = bn_init(key)
    tx = optim.adamw(1e-3)
    with CompileCounter(_build_jit) as counter:
        states = [TrainState.create(params, tx, i, model_state=stats) for i in range(3)]
    assert counter.count == 1
    assert all(s.params["dense_0"]["w"] is not params["dense_0"]["w"] for s in states)
    assert all(not s.model_state["mean"].is_deleted() for s in states)


def test_configuration_is_a_static_field_of_a_subclass(key):
    tx = optim.adam(1e-3)
    with pytest.raises(TypeError, match=r"`depth` is not a static field of TrainState"):
        TrainState.create(init_params(key), tx, 0, depth=2)
    assert len(dataclasses.fields(TrainState)) == 7  # the contract's limit
    from jaxwise.checkpoint import CheckpointError
    from jaxwise.checkpoint._leaves import check_static

    state = TrainState.create(init_params(key), tx, 0)
    check_static({"static": {"config": []}}, state)  # a checkpoint of an older TrainState
    with pytest.raises(CheckpointError, match="`config` held depth=2.*class MyState"):
        check_static({"static": {"config": [["depth", 2]]}}, state)

"""Checkpoints: nesting kept, sharded restore, damage table, writer lock, orbax/Flax interop."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from host64 import mesh_devices
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jaxwise import optim
from jaxwise.checkpoint import (
    Checkpointer,
    CheckpointError,
    CheckpointWarning,
    data_fingerprint,
    latest_step,
    load_metadata,
    restore,
    save,
)
from jaxwise.checkpoint._format import checkpoint_checksums
from jaxwise.compilation import CompileCounter
from jaxwise.train import TrainState
from jaxwise.tree import host_copy


def awkward_params(key):
    """Keys that collide when flattened to dotted names, plus slashes and percent signs."""
    k1, k2, k3 = jax.random.split(key, 3)
    return {
        "enc.w": jax.random.normal(k1, (3, 4)),
        "enc": {"w": jax.random.normal(k2, (3, 4)), "b/x": jnp.arange(4, dtype=jnp.float32)},
        "a%2Eb": jnp.full((2,), 7.0),
        "layers": [jax.random.normal(k3, (4,)), jnp.ones((2, 2))],
    }


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class WideState(TrainState):
    """A state with configuration of its own (a static field)."""

    width: int = dataclasses.field(default=0, metadata=dict(static=True))


def make_state(key, step=0, **static):
    model_state = {
        "bn.mean": jnp.full((4,), 0.5),
        "bn": {"mean": jnp.zeros(4), "count": jnp.asarray(3)},
    }
    state = (WideState if static else TrainState).create(
        awkward_params(key), optim.adam(1e-3), jax.random.key(11), model_state=model_state, **static
    )
    return state.replace(step=jnp.asarray(step, jnp.int32))


def bits(state):
    return [np.asarray(leaf).tobytes() for leaf in jax.tree.leaves(host_copy(state))]


def assert_same(a, b):
    # the optimizer (static `tx`) comes from `like`: compare everything else
    if isinstance(a, TrainState):
        a, b = a.replace(tx=None), b.replace(tx=None)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert bits(a) == bits(b)


def test_roundtrip_keeps_nesting_keys_model_state_and_metadata(tmp_path, key):
    state = make_state(key, step=5, width=8)
    out = save(tmp_path / "ck", state, {"epoch": 2, "note": "dotted"})
    assert out == (tmp_path / "ck" / "5").absolute()
    restored = restore(tmp_path / "ck", like=make_state(jax.random.key(9), width=8))
    meta = load_metadata(tmp_path / "ck", step=int(restored.step))
    assert_same(restored, state)
    assert jnp.issubdtype(restored.key.dtype, jax.dtypes.prng_key)
    assert restored.params["enc.w"].tolist() != restored.params["enc"]["w"].tolist()
    assert meta == {"epoch": 2, "note": "dotted"} == load_metadata(tmp_path / "ck")
    assert latest_step(tmp_path / "ck") == 5
    with pytest.raises(CheckpointError, match="static `width`"):
        restore(tmp_path / "ck", like=make_state(key, width=9))


def test_restore_places_arrays_on_a_4_device_sharded_like(tmp_path, key):
    state = make_state(key, step=1)
    save(tmp_path / "ck", state)
    mesh = Mesh(np.asarray(mesh_devices(4)), ("data",))

    def spec(leaf):
        sharded = (
            leaf.ndim >= 1
            and leaf.shape[0] % 4 == 0
            and not jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        )
        return NamedSharding(mesh, P("data") if sharded else P())

    like = make_state(jax.random.key(3))
    shardings = jax.tree.map(spec, like)
    like = jax.tree.map(jax.device_put, like, shardings)
    restored = restore(tmp_path / "ck", like=like)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(shardings)):
        assert got.sharding == want
    assert restored.params["enc"]["b/x"].sharding.spec == P("data")
    assert_same(restored, state)


def test_restore_accepts_an_abstract_like(tmp_path, key):
    state = make_state(key, step=4)
    save(tmp_path / "ck", state)
    abstract = jax.eval_shape(lambda: make_state(key, step=0))
    assert_same(restore(tmp_path / "ck", like=abstract), state)


def _data_file(step_dir):
    """The one data file of a step's OCDBT store (every leaf's bytes)."""
    (found,) = (step_dir / "state" / "d").iterdir()
    return found


def _largest_file(directory):
    return max((p for p in directory.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)


def _flip(step_dir):
    target = _largest_file(step_dir / "state")
    blob = bytearray(target.read_bytes())
    for i in range(len(blob) // 3, len(blob) // 3 + 16):
        blob[i] ^= 0x5A
    target.write_bytes(bytes(blob))


def _truncate(step_dir):
    target = _largest_file(step_dir / "state")
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])


def _edit_metadata(step_dir):
    path = step_dir / "meta" / "metadata"
    doc = json.loads(path.read_text())
    doc["user"]["epoch"] = 99
    path.write_text(json.dumps(doc))


def _edit_stored_step(step_dir):
    path = step_dir / "meta" / "metadata"
    doc = json.loads(path.read_text())
    doc["step"] += 100
    path.write_text(json.dumps(doc))


def _drop_state_item(step_dir):
    for p in sorted((step_dir / "state").rglob("*"), reverse=True):
        p.unlink() if p.is_file() else p.rmdir()
    (step_dir / "state").rmdir()


DAMAGE = {
    "bytes flipped": _flip,
    "truncated": _truncate,
    "metadata edited": _edit_metadata,
    "metadata step edited": _edit_stored_step,
    "state item missing": _drop_state_item,
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_newest_step_falls_back_to_the_last_intact_one(tmp_path, key, damage):
    ck = tmp_path / "ck"
    with Checkpointer(ck) as writer:
        writer.save(make_state(key, step=1), {"epoch": 1})
        writer.save(make_state(jax.random.key(1), step=2), {"epoch": 2})
    DAMAGE[damage](ck / "2")
    like = make_state(key)
    with pytest.warns(
        CheckpointWarning, match=r"skipped damaged checkpoint step 2 \(.*\) in .*; restored step 1"
    ):
        restored = restore(ck, like=like)
    assert int(restored.step) == 1 and load_metadata(ck, step=1) == {"epoch": 1}
    assert_same(restored, make_state(key, step=1))
    with pytest.raises(CheckpointError, match="checkpoint step 2 in .* is damaged") as info:
        restore(ck, like=like, step=2)
    assert "\n" not in str(info.value)
    DAMAGE[damage](ck / "1")
    with pytest.raises(
        CheckpointError, match="no intact checkpoint in .*: step 2 .*; step 1"
    ) as info:
        restore(ck, like=like)
    assert "\n" not in str(info.value)


def test_stray_empty_step_dir_is_skipped_and_set_aside_by_the_next_save(tmp_path, key):
    ck = tmp_path / "ck"
    save(ck, make_state(key, step=1), {"epoch": 1})
    (ck / "7").mkdir()
    assert latest_step(ck) == 1
    assert load_metadata(ck) == {"epoch": 1}
    with pytest.warns(CheckpointWarning, match=r"step 7 \(it is incomplete"):
        assert int(restore(ck, like=make_state(key)).step) == 1
    save(ck, make_state(key, step=7), {"epoch": 7})
    assert latest_step(ck) == 7 and (ck / "7.damaged-0").is_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert int(restore(ck, like=make_state(key)).step) == 7


def test_a_second_writer_fails_at_once_and_nothing_is_lost(tmp_path, key):
    ck = tmp_path / "ck"
    with Checkpointer(ck, keep=2) as first:
        first.save(make_state(key, step=1))
        with pytest.raises(CheckpointError, match="in use by another writer"):
            Checkpointer(ck)
        with pytest.raises(CheckpointError, match="in use by another writer"):
            save(ck, make_state(key, step=9))
        first.save(make_state(key, step=2))
        with pytest.raises(CheckpointError, match="a checkpoint for step 2 already exists"):
            first.save(make_state(jax.random.key(5), step=2))
    assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["1", "2"]
    with pytest.raises(CheckpointError, match="is closed"):
        first.save(make_state(key, step=3))
    assert_same(restore(ck, like=make_state(key)), make_state(key, step=2))
    save(ck, make_state(key, step=3), keep=2)  # the lock was released by `with`
    assert sorted(p.name for p in ck.iterdir() if p.name.isdigit()) == ["2", "3"]


def test_retention_never_deletes_newer_steps(tmp_path, key):
    ck = tmp_path / "ck"
    for step in (10, 20):
        save(ck, make_state(key, step=step), keep=1)
    save(ck, make_state(key, step=5), keep=1)  # an older run writing into the same directory
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == [5, 20]


WRITER = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp
    from jaxwise import optim
    from jaxwise.checkpoint import Checkpointer
    from jaxwise.train import TrainState
    with Checkpointer(sys.argv[1]) as ck:
        ck.save(TrainState.create({"w": jnp.ones(3)}, optim.sgd(0.1), 0))
        print("locked", flush=True)
        sys.stdin.read()
    """
)


@pytest.mark.slow
def test_a_writer_in_another_process_blocks_this_one(tmp_path, key):
    ck = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(ck)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        with pytest.raises(
            CheckpointError, match=r"in use by another writer \(process \d+ on host .+\(python -c "
        ):
            save(
                ck,
                TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0).replace(
                    step=jnp.asarray(1)
                ),
            )
    finally:
        proc.communicate("", timeout=60)
    assert proc.returncode == 0
    assert latest_step(ck) == 0
    save(ck, TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0).replace(step=jnp.asarray(1)))
    assert latest_step(ck) == 1


def test_async_save_keeps_the_newest_and_restores(tmp_path, key):
    ck = tmp_path / "ck"
    states = [make_state(jax.random.key(i), step=i) for i in range(1, 5)]
    with Checkpointer(ck, keep=2, async_save=True) as writer:
        for state in states:
            writer.save(state, {"i": int(state.step)})
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == [3, 4]
    assert_same(restore(ck, like=make_state(key)), states[-1])
    assert load_metadata(ck, step=3) == {"i": 3}


@pytest.fixture
def orbax_writes(monkeypatch):
    """Steps written as in a multi-process job: an orbax pytree item beside the metadata."""
    from jaxwise.checkpoint import _checkpointer

    monkeypatch.setattr(_checkpointer, "writes_natively", lambda: False)


def test_plain_orbax_reads_a_multi_process_jaxwise_checkpoint(tmp_path, key, orbax_writes):
    state = make_state(key, step=3)
    save(tmp_path / "ck", state)
    assert_same(restore(tmp_path / "ck", like=make_state(jax.random.key(2))), state)
    manager = ocp.CheckpointManager(tmp_path / "ck")
    tree = manager.restore(3, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
    manager.close()
    np.testing.assert_array_equal(tree["params"]["enc%2Ew"], state.params["enc.w"])
    np.testing.assert_array_equal(tree["params"]["enc"]["b%2Fx"], state.params["enc"]["b/x"])
    np.testing.assert_array_equal(
        tree["opt_state"]["0"]["mu"]["enc"]["w"], state.opt_state[0].mu["enc"]["w"]
    )
    np.testing.assert_array_equal(tree["model_state"]["bn"]["count"], 3)
    np.testing.assert_array_equal(tree["key"], jax.random.key_data(state.key))


def plain_state(key, step=0):
    params = {
        "enc": {"w": jax.random.normal(key, (3, 4)), "b": jnp.zeros(4)},
        "layers": [jnp.ones((2, 2))],
    }
    state = TrainState.create(
        params, optim.adam(1e-3), jax.random.key(11), model_state={"bn": jnp.ones(4)}
    )
    return state.replace(step=jnp.asarray(step, jnp.int32))


def test_jaxwise_restores_a_plain_orbax_checkpoint(tmp_path, key):
    state = plain_state(key, step=6)
    tree = {
        "step": state.step,
        "params": state.params,
        "opt_state": state.opt_state,
        "key": jax.random.key_data(state.key),
        "model_state": state.model_state,
    }
    with ocp.CheckpointManager(tmp_path / "plain") as manager:
        manager.save(6, args=ocp.args.StandardSave(tree))
    assert latest_step(tmp_path / "plain") == 6
    assert_same(restore(tmp_path / "plain", like=plain_state(jax.random.key(4))), state)
    wrong = plain_state(key)
    wrong = wrong.replace(params={**wrong.params, "layers": [jnp.ones((2, 3))]})
    with pytest.raises(
        CheckpointError, match=r"at `params.layers.0`: checkpoint shape \[2, 2\], `like` \[2, 3\]"
    ):
        restore(tmp_path / "plain", like=wrong)
    with pytest.raises(CheckpointError, match="the checkpoint has no `params.extra`"):
        restore(
            tmp_path / "plain", like=wrong.replace(params={**state.params, "extra": jnp.ones(1)})
        )
    # Plain orbax names arrays by dotted paths: "enc.w" and enc/w would have collided on disk.
    with pytest.raises(
        CheckpointError, match="plain orbax stores under the same name `params.enc.w`"
    ):
        restore(tmp_path / "plain", like=make_state(key))


def test_jaxwise_restores_a_flax_train_state(tmp_path, key):
    from flax.training import train_state

    params = {"dense": {"kernel": jax.random.normal(key, (3, 2)), "bias": jnp.zeros(2)}}
    flax_state = train_state.TrainState.create(
        apply_fn=lambda *a: None, params=params, tx=optax.adam(1e-2)
    )
    grads = jax.tree.map(jnp.ones_like, params)
    with jax.numpy_dtype_promotion("standard"):
        flax_state = flax_state.apply_gradients(grads=grads)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "flax", flax_state)
    like = TrainState.create(params, optim.adam(1e-2), jax.random.key(0))
    restored = restore(tmp_path / "flax", like=like)
    assert int(restored.step) == 1 and restored.step.dtype == jnp.int32
    np.testing.assert_array_equal(
        restored.params["dense"]["kernel"], flax_state.params["dense"]["kernel"]
    )
    for got, want in zip(
        jax.tree.leaves(restored.opt_state), jax.tree.leaves(flax_state.opt_state)
    ):
        np.testing.assert_array_equal(got, want)
    assert_same(restored.key, like.key)  # Flax states carry no key: `like`'s is kept


def test_checksum_compiles_once_for_multi_process_saves_and_restore(tmp_path, key, orbax_writes):
    def unique_state(step):  # shapes no other test uses, so the first compile happens here
        params = {"w": jax.random.normal(key, (13, 7)), "b": jnp.zeros(7)}
        return TrainState.create(params, optim.adam(1e-3), step).replace(
            step=jnp.asarray(step, jnp.int32)
        )

    with CompileCounter(checkpoint_checksums) as counter:
        with Checkpointer(tmp_path / "ck") as writer:
            writer.save(unique_state(1))
            writer.save(unique_state(2))
        restore(tmp_path / "ck", like=unique_state(0))
    assert counter.count == 1


def test_orbax_logging_is_silenced(tmp_path, key, capfd):
    save(tmp_path / "ck", make_state(key))
    restore(tmp_path / "ck", like=make_state(key))
    captured = capfd.readouterr()
    assert "absl" not in captured.err and "WARNING" not in captured.err, captured.err


def test_data_fingerprint_tells_data_apart(rng):
    x, y = rng.normal(size=(20, 3)).astype(np.float32), rng.integers(0, 2, 20)
    fp = data_fingerprint((x, y))
    assert fp == data_fingerprint((x.copy(), y.copy())) and json.loads(json.dumps(fp)) == fp
    x2 = x.copy()
    x2[7, 1] += 1e-6
    assert data_fingerprint((x2, y))["sha256"] != fp["sha256"]
    assert data_fingerprint((x[:19], y[:19]))["shapes"] == [[19, 3], [19]]
    assert data_fingerprint((x.astype(np.float64), y))["dtypes"][0] == "float64"


def test_bad_arguments_are_named(tmp_path, key):
    state = make_state(key)
    with pytest.raises(TypeError, match="`step` is required to save a dict"):
        save(tmp_path / "a", {"w": jnp.ones(2)})
    with pytest.raises(TypeError, match="`tree` must be a pytree of arrays, got a str at `w`"):
        save(tmp_path / "a", {"w": "x"}, step=1)
    with pytest.raises(TypeError, match="`step` must be an int"):
        save(tmp_path / "a", {"w": jnp.ones(2)}, step=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="`step` must be >= 0"):
        save(tmp_path / "a", {"w": jnp.ones(2)}, step=-1)
    with pytest.raises(TypeError, match="`metadata` must be JSON-serialisable"):
        save(tmp_path / "b", state, {"x": object()})
    with pytest.raises(ValueError, match="`keep` must be >= 1"):
        save(tmp_path / "c", state, keep=0)
    save(tmp_path / "d", state)
    with pytest.raises(TypeError, match="`like` must be a pytree of arrays, got a str at `w`"):
        restore(tmp_path / "d", like={"w": "x"})
    with pytest.raises(TypeError, match="`step` must be an int"):
        restore(tmp_path / "d", like=state, step="0")  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        restore(tmp_path / "missing", like=state)
    with pytest.raises(CheckpointError, match="no checkpoint for step 3 .* available: \\[0\\]"):
        restore(tmp_path / "d", like=state, step=3)


def test_metadata_is_strict_json_nan_and_infinity_refused_by_name(tmp_path, key):
    state = make_state(key, step=1)
    cases = [
        ({"loss": float("nan")}, r"`metadata\['loss'\]` is nan"),
        ({"eval": {"acc": [0.5, float("inf")]}}, r"`metadata\['eval'\]\['acc'\]\[1\]` is inf"),
        ({"lr": -float("inf")}, r"`metadata\['lr'\]` is -inf"),
    ]
    with Checkpointer(tmp_path / "ck") as ck:
        for metadata, named in cases:
            with pytest.raises(ValueError, match="must be strict JSON: " + named):
                ck.save(state, metadata)
        with pytest.raises(TypeError, match=r"`metadata\['x'\]` is a float32"):
            ck.save(state, {"x": np.float32("nan")})  # NumPy scalars are not JSON either
        assert not (tmp_path / "ck" / "1").exists()  # nothing written for a refused save
        ck.save(state, {"loss": 0.25, "note": None})
        ck.wait()
    text = next((tmp_path / "ck" / "1").rglob("metadata")).read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON {c}"))
    assert load_metadata(tmp_path / "ck") == {"loss": 0.25, "note": None}


def test_doc_directory_layout_is_what_the_docs_say(tmp_path, key):
    step_dir = save(tmp_path / "ck", make_state(key))
    assert sorted(p.name for p in Path(step_dir).iterdir() if p.is_dir()) == ["meta", "state"]


# ---------------------------------------------------------------------------
# Run identity, crash leftovers, full disks, signals
# ---------------------------------------------------------------------------


def _small(step, value=1.0):
    state = TrainState.create({"w": jnp.full(3, value)}, optim.sgd(0.1), 0)
    return state.replace(step=jnp.asarray(step, jnp.int32))


def _listing(root):
    return sorted(
        (str(p.relative_to(root)), p.read_bytes() if p.is_file() else b"")
        for p in root.rglob("*")
        if p.name != ".jaxwise-writer.lock"
    )


def test_steps_of_another_run_are_never_taken(tmp_path):
    ck = tmp_path / "ck"
    with Checkpointer(ck, run_id="run-a") as writer:
        writer.save(_small(1), {"epoch": 1})
        writer.save(_small(2, 2.0), {"epoch": 2})
    save(ck, _small(5, 5.0), {"epoch": 5}, run_id="run-b")  # a crashed run's leftover step
    assert latest_step(ck, run_id="run-a") == 2 and latest_step(ck) == 5
    assert load_metadata(ck, run_id="run-a") == {"epoch": 2}
    with pytest.warns(
        CheckpointWarning,
        match=r"^skipped checkpoint step 5 \(written by another run\) in .*; restored step 2$",
    ):
        state = restore(ck, like=_small(0), run_id="run-a")
    meta = load_metadata(ck, step=int(state.step), run_id="run-a")
    assert meta == {"epoch": 2} and state.params["w"].tolist() == [2.0] * 3
    with pytest.raises(CheckpointError, match="checkpoint step 5 in .*: written by another run"):
        load_metadata(ck, step=5, run_id="run-a")
    with pytest.raises(CheckpointError, match="step 5 in .* is not this run's"):
        restore(ck, like=_small(0), step=5, run_id="run-a")
    # run-a reaching step 5 moves run-b's step aside (kept), and retention spares it
    save(ck, _small(5, 7.0), {"epoch": 5}, run_id="run-a", keep=1)
    names = sorted(p.name for p in ck.iterdir() if not p.name.startswith("."))
    assert names == ["5", "5.stray-0"]
    assert load_metadata(ck, run_id="run-a") == {"epoch": 5}
    with pytest.raises(TypeError, match="`run_id` must be a non-empty str"):
        latest_step(ck, run_id="")


def test_a_renamed_step_directory_is_never_taken(tmp_path):
    ck = tmp_path / "ck"
    save(ck, _small(1), {"epoch": 1})
    shutil.copytree(ck / "1", ck / "99")  # a stray, higher-numbered copy
    assert latest_step(ck) == 1 and load_metadata(ck) == {"epoch": 1}
    with pytest.warns(CheckpointWarning, match=r"step 99 \(its metadata says step 1: a renamed"):
        assert int(restore(ck, like=_small(0)).step) == 1
    save(ck, _small(99), {"epoch": 99})  # the copy is moved aside, never overwritten
    assert (ck / "99.stray-0").is_dir() and load_metadata(ck) == {"epoch": 99}


def test_orbax_leftovers_of_a_crash_are_ignored_and_cleared_by_the_writer(tmp_path):
    ck = tmp_path / "ck"
    save(ck, _small(1), {"epoch": 1})
    leftover = ck / "2.orbax-checkpoint-tmp"
    (leftover / "state").mkdir(parents=True)
    (leftover / "state" / "data").write_bytes(b"half")
    assert latest_step(ck) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert int(restore(ck, like=_small(0)).step) == 1
    save(ck, _small(2), {"epoch": 2})
    assert not leftover.exists() and latest_step(ck) == 2


def test_checkpointer_on_a_file_is_named(tmp_path):
    path = tmp_path / "file.txt"
    path.write_text("mine")
    with pytest.raises(CheckpointError, match=r"file.txt: is a file, expected a directory"):
        Checkpointer(path)
    assert path.read_text() == "mine"


def _failing_write(monkeypatch, half_written):
    """The data file's write fails as a full disk makes it fail, after writing part of it."""
    import errno

    from jaxwise.checkpoint import _native, _safety

    monkeypatch.setattr(_safety, "check_space", lambda target, needed: None)

    def write_all(fd, buffers):
        os.write(fd, half_written)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_native, "_write_all", write_all)


def test_a_full_disk_is_one_oserror_and_nothing_is_left(tmp_path, monkeypatch):
    import errno

    ck = tmp_path / "ck"
    save(ck, _small(1), {"epoch": 1})
    before = _listing(ck)
    with monkeypatch.context() as patched:
        _failing_write(patched, b"x" * 100)
        with pytest.raises(OSError) as info:
            save(ck, _small(2), {"epoch": 2})
    assert info.value.errno == errno.ENOSPC and info.value.filename == str(ck.absolute() / "2")
    assert _listing(ck) == before  # no temporary files; step 1 byte-identical
    assert int(restore(ck, like=_small(0)).step) == 1
    with Checkpointer(ck) as writer:  # the lock was released: the next write works
        writer.save(_small(2), {"epoch": 2})


@pytest.fixture
def small_disk(tmpfs):
    return tmpfs("400k")


def test_a_real_full_disk_refuses_the_step_and_keeps_the_last_one(small_disk):
    import errno

    ck = small_disk / "ck"
    save(ck, _small(1), {"epoch": 1})
    before = _listing(ck)
    big = TrainState.create(
        {"w": jax.random.normal(jax.random.key(0), (200_000,))}, optim.sgd(0.1), 0
    ).replace(step=jnp.asarray(2, jnp.int32))
    with pytest.raises(OSError, match=r"No space left on device \(the checkpoint needs") as info:
        save(ck, big, {"epoch": 2})
    assert info.value.errno == errno.ENOSPC and info.value.filename.endswith("/ck/2")
    assert _listing(ck) == before
    assert int(restore(ck, like=_small(0)).step) == 1


ORBAX_FULL_DISK = textwrap.dedent(
    """
    import sys, jax, jax.numpy as jnp
    from jaxwise import optim
    from jaxwise.checkpoint import _safety, save
    from jaxwise.train import TrainState
    _safety.check_space = lambda target, needed: None  # let orbax meet the full disk itself
    state = TrainState.create({"w": jnp.ones(3)}, optim.sgd(0.1), 0)
    save(sys.argv[1], state)
    big = TrainState.create({"w": jax.random.normal(jax.random.key(0), (200_000,))},
                            optim.sgd(0.1), 0).replace(step=jnp.asarray(1, jnp.int32))
    try:
        save(sys.argv[1], big)
    except OSError as err:
        print(err.errno, err.filename)
    """
)


@pytest.mark.slow
def test_orbax_meeting_a_full_disk_prints_nothing_and_leaves_nothing(small_disk):
    ck = small_disk / "ck"
    proc = subprocess.run(
        [sys.executable, "-c", ORBAX_FULL_DISK, str(ck)], capture_output=True, text=True
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert proc.stdout.split() == ["28", str(ck / "1")]
    assert sorted(p.name for p in ck.iterdir()) == [".jaxwise-writer.lock", "0"]


def test_signals_during_a_write_are_delivered_after_it():
    import signal

    from jaxwise._shared._interrupt import signals_held

    done = []
    with pytest.raises(KeyboardInterrupt):
        with signals_held():
            os.kill(os.getpid(), signal.SIGINT)
            done.append("after the signal")
    assert done == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


INTERRUPTED_SAVE = textwrap.dedent(
    """
    import os, signal, sys, jax.numpy as jnp
    from jaxwise import optim
    from jaxwise.checkpoint import _native, latest_step, save
    from jaxwise.train import TrainState
    original = _native.write_step
    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the write
        return original(*args, **kwargs)
    _native.write_step = interrupted
    try:
        save(sys.argv[1], TrainState.create({"w": jnp.ones(3)}, optim.sgd(0.1), 0))
    except KeyboardInterrupt:
        print("interrupted after step", latest_step(sys.argv[1]))
    """
)


@pytest.mark.slow
def test_ctrl_c_during_a_save_finishes_it_and_prints_no_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_SAVE, str(tmp_path / "ck")],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr[-3000:]
    assert proc.stdout.strip() == "interrupted after step 0"


def test_tensorstore_closed_loop_reports_are_dropped_and_nothing_else(monkeypatch):
    import asyncio
    import types

    from jaxwise.checkpoint import _safety

    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_value))
    _safety.drop_closed_loop_reports()
    loop = asyncio.new_event_loop()
    loop.close()
    with pytest.raises(RuntimeError) as raised:
        loop.call_soon_threadsafe(print)
    closed = raised.value
    other = RuntimeError("Event loop is closed")  # raised elsewhere: reported
    for exc in (closed, other, ValueError("boom")):
        sys.unraisablehook(
            types.SimpleNamespace(  # pyright: ignore[reportArgumentType]  # the hook's fields
                exc_type=type(exc),
                exc_value=exc,
                exc_traceback=exc.__traceback__,
                err_msg=None,
                object=None,
            )
        )
    assert len(seen) == 2 and seen[0] is other and isinstance(seen[1], ValueError)


@pytest.mark.slow
def test_the_lock_of_a_writer_killed_holding_it_is_taken_over_with_a_warning(tmp_path):
    import signal

    ck = tmp_path / "ck"
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(ck)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
    proc.send_signal(signal.SIGKILL)  # it dies holding the lock: the OS releases the flock
    proc.communicate()
    with pytest.warns(
        CheckpointWarning, match=rf"took over the writer lock of .*: process {proc.pid} on host"
    ):
        save(ck, _small(1), {"epoch": 1})
    assert latest_step(ck) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # released cleanly this time: nothing to say
        save(ck, _small(2), {"epoch": 2})


def test_a_damaged_newest_step_is_moved_aside_and_saved_again(tmp_path):
    """restore skips a step whose data fails its CRC; saving that step again replaces it."""
    with Checkpointer(tmp_path, keep=3) as ck:
        ck.save({"w": jnp.ones(4)}, step=1)
        ck.save({"w": jnp.full(4, 2.0)}, step=2)
    data = _data_file(tmp_path / "2")
    damaged = bytearray(data.read_bytes())
    damaged[0] ^= 0x01
    data.write_bytes(damaged)
    with pytest.warns(CheckpointWarning, match="skipped damaged checkpoint step 2"):
        assert restore(tmp_path, like={"w": jnp.zeros(4)})["w"].tolist() == [1.0] * 4
    with Checkpointer(tmp_path, keep=3) as ck:
        aside = r"step 2 .* is damaged .*moved aside as 2\.damaged-0"
        with pytest.warns(CheckpointWarning, match=aside):
            ck.save({"w": jnp.full(4, 3.0)}, step=2)
        with pytest.raises(CheckpointError, match="already exists"):  # an intact step: never
            ck.save({"w": jnp.full(4, 4.0)}, step=2)
    assert (tmp_path / "2.damaged-0" / data.relative_to(tmp_path / "2")).read_bytes() == bytes(
        damaged
    )
    assert restore(tmp_path, like={"w": jnp.zeros(4)})["w"].tolist() == [3.0] * 4


def test_export_orbax_gives_plain_orbax_the_nested_step(tmp_path, key):
    """Every saved step can be handed to plain orbax as a pytree with its nesting."""
    from jaxwise.checkpoint import export_orbax
    from jaxwise.checkpoint._format import stored_parts

    state = make_state(key, step=7)
    with Checkpointer(tmp_path / "ck", keep=3) as ck:
        ck.save(make_state(key, step=3))
        ck.save(state)
    out = export_orbax(tmp_path / "ck", tmp_path / "orbax")
    with ocp.StandardCheckpointer() as plain:
        tree = plain.restore(out)
    flat, _ = jax.tree_util.tree_flatten_with_path(state)
    for path, leaf in flat:  # every leaf at its nested place, bit for bit
        node = tree
        for part in stored_parts(path):
            node = node[part]
        typed = jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        want = jax.random.key_data(leaf) if typed else leaf
        assert np.asarray(node).tobytes() == np.asarray(want).tobytes(), path
    assert set(tree) == {"step", "params", "opt_state", "key", "model_state"}
    assert set(tree["model_state"]) == {"bn%2Emean", "bn"}  # "bn.mean" and "bn"/"mean" kept apart
    simple = {"enc": {"w": jnp.arange(3.0)}, "n": jnp.asarray(2)}
    save(tmp_path / "simple", simple, step=1)
    again = restore(export_orbax(tmp_path / "simple", tmp_path / "simple-orbax"), like=simple)
    assert again["enc"]["w"].tolist() == [0.0, 1.0, 2.0]  # jaxwise reads an export too
    earlier = export_orbax(tmp_path / "ck", tmp_path / "orbax-3", step=3)
    with ocp.StandardCheckpointer() as plain:
        assert int(plain.restore(earlier)["step"]) == 3
    with pytest.raises(CheckpointError, match="exists"):
        export_orbax(tmp_path / "ck", out)
    data = _data_file(tmp_path / "ck" / "7")
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 3] ^= 0x01
    data.write_bytes(damaged)
    with pytest.raises(CheckpointError, match="damaged"):
        export_orbax(tmp_path / "ck", tmp_path / "bad", step=7)
    assert not (tmp_path / "bad").exists()


def test_an_earlier_train_states_config_restores_into_the_subclass_its_error_names(tmp_path, key):
    """A checkpoint of the TrainState that kept `config` pairs: refused by a plain TrainState
    with the subclass to write (its fields and values), restored into that subclass."""
    from jaxwise.checkpoint import _format as fmt

    state = make_state(key, step=3, width=2)
    save(tmp_path / "ck", state)
    meta = tmp_path / "ck" / "3" / fmt.META / "metadata"
    doc = json.loads(meta.read_text())
    doc.pop("digest")
    doc["static"] = {"config": [["width", 2]]}  # what the earlier TrainState saved
    meta.write_text(json.dumps(fmt.seal(doc)))
    with pytest.raises(
        CheckpointError, match="earlier TrainState whose `config` held width=2"
    ) as e:
        restore(tmp_path / "ck", make_state(key))
    assert "width: int = dataclasses.field(default=2, metadata=dict(static=True))" in str(e.value)
    assert "MyState.create(params, tx, key, width=2)" in str(e.value)
    with pytest.raises(CheckpointError, match="width=2"):
        restore(tmp_path / "ck", make_state(key, width=5))  # the subclass, another value
    assert_same(restore(tmp_path / "ck", make_state(key, width=2)), state)

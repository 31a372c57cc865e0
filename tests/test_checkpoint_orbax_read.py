"""Plain orbax reads every step jaxwise writes; the single-file steps before it still restore."""

import json
import runpy
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
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
    export_orbax,
    latest_step,
    load_metadata,
    restore,
    save,
)
from jaxwise.checkpoint._format import stored_parts
from jaxwise.train import TrainState

FORMAT3 = Path(__file__).parent / "data" / "checkpoint_format3"


def many_dtypes():
    """Nesting, keys orbax would take for separators, every kind of leaf a state holds."""
    return {
        "params": {
            "enc.w": jnp.arange(12.0).reshape(3, 4),
            "enc": {"w": -jnp.arange(12.0).reshape(3, 4), "b/x": jnp.ones(4, jnp.bfloat16)},
            "a%2Eb": jnp.asarray([1 + 2j, -3j], jnp.complex64),
        },
        "layers": [jnp.asarray([1, -2, 3], jnp.int8), jnp.asarray([True, False])],
        "_METADATA": jnp.full((2,), 0.25, jnp.float16),  # named like orbax's own file
        "empty": jnp.zeros((0, 3)),
        "count": jnp.asarray(3, jnp.int32),
        "key": jax.random.key(4),
    }


def raw(leaf):
    typed = jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key)
    return np.asarray(jax.random.key_data(leaf) if typed else leaf)


def assert_plain_tree(tree, saved):
    """``tree`` (what orbax restored) holds every leaf of ``saved`` at its nested place."""
    flat, _ = jax.tree_util.tree_flatten_with_path(saved)
    assert len(jax.tree.leaves(tree)) == len(flat)
    for path, leaf in flat:
        node = tree
        for part in stored_parts(path):
            node = node[part]
        want = raw(leaf)
        assert node.dtype == want.dtype and node.shape == want.shape, path
        assert np.asarray(node).tobytes() == want.tobytes(), path


def plain_restore(item, target=None):
    with ocp.StandardCheckpointer() as plain:
        return plain.restore(item) if target is None else plain.restore(item, target)


def test_plain_orbax_restores_a_step_without_a_target_bit_for_bit(tmp_path):
    tree = many_dtypes()
    with Checkpointer(tmp_path / "ck") as ck:  # asynchronous, the default
        ck.save(tree, {"epoch": 1}, step=10)
    restored = plain_restore(tmp_path / "ck" / "10" / "state")
    assert_plain_tree(restored, tree)
    assert set(restored["params"]) == {"enc%2Ew", "enc", "a%252Eb"}  # escaped, never merged
    assert isinstance(restored["count"], jax.Array)
    like = jax.tree.map(jnp.zeros_like, tree)
    back = restore(tmp_path / "ck", like=like)  # and jaxwise restores the same step
    assert [raw(a).tobytes() for a in jax.tree.leaves(back)] == [
        raw(a).tobytes() for a in jax.tree.leaves(tree)
    ]


def test_plain_orbax_restores_a_train_state_with_a_target_tree(tmp_path):
    state = TrainState.create(
        {"dense": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3)}},
        optim.adam(1e-3),
        jax.random.key(0),
    ).replace(step=jnp.asarray(5, jnp.int32))
    save(tmp_path / "ck", state, {"epoch": 0})
    item = tmp_path / "ck" / "5" / "state"
    with ocp.StandardCheckpointer() as plain:
        stored = plain.metadata(item).item_metadata.tree  # the tree orbax sees, read by orbax
    target = jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=m.sharding.to_jax_sharding()),
        stored,
    )
    restored = plain_restore(item, target)
    assert_plain_tree(restored, state.replace(tx=None))
    assert set(restored) == {"step", "params", "opt_state", "key"}  # model_state: no leaves


def test_plain_orbax_restores_a_dict_state_into_its_own_abstract_tree(tmp_path):
    """A state whose keys need no escaping: its own ShapeDtypeStructs are orbax's target."""
    tree = {"w": jnp.arange(4.0), "opt": {"mu": jnp.ones(4, jnp.bfloat16)}, "n": jnp.asarray(2)}
    save(tmp_path / "ck", tree, step=3)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)
    restored = plain_restore(tmp_path / "ck" / "3" / "state", target)
    assert jax.tree.structure(restored) == jax.tree.structure(tree)
    for got, want in zip(jax.tree.leaves(restored), jax.tree.leaves(tree)):
        assert got.dtype == want.dtype and raw(got).tobytes() == raw(want).tobytes()


def test_plain_orbax_restores_a_sharded_step_onto_its_mesh(tmp_path):
    devices = mesh_devices(2)
    if len(devices) < 2 or devices[0].platform != jax.default_backend():
        # orbax places a plain restore on the saved device ids of the default backend
        pytest.skip("needs two devices of the default backend (orbax restores onto them)")
    mesh = Mesh(np.asarray(devices), ("data",))
    w = jax.device_put(jnp.arange(8.0).reshape(4, 2), NamedSharding(mesh, P("data")))
    save(tmp_path / "ck", {"w": w}, step=1)
    restored = plain_restore(tmp_path / "ck" / "1" / "state")["w"]
    assert restored.sharding.is_equivalent_to(w.sharding, w.ndim)
    assert raw(restored).tobytes() == raw(w).tobytes()


def test_a_damaged_file_that_only_orbax_reads_is_caught_by_restore(tmp_path):
    """``_METADATA`` and ``_sharding`` are orbax's, not read by a jaxwise restore: their
    CRC-32s are sealed in the step's metadata, so their damage is seen all the same."""
    for name in ("_METADATA", "_sharding"):
        ck = tmp_path / name
        save(ck, {"w": jnp.ones(3)}, step=1)
        save(ck, {"w": jnp.full(3, 2.0)}, step=2)
        path = ck / "2" / "state" / name
        path.write_text(path.read_text().replace('"', "'", 1))
        with pytest.warns(CheckpointWarning, match=rf"step 2 \(its orbax `{name}` fails its"):
            assert restore(ck, like={"w": jnp.zeros(3)})["w"].tolist() == [1.0] * 3


def test_a_single_file_step_of_before_still_restores_bit_for_bit(tmp_path):
    """The layout written until the fifth round (``state/data``) restores, is listed, its
    metadata read and exported; a new step beside it is written in orbax's layout."""
    tree = runpy.run_path(str(FORMAT3.parent / "make_checkpoint_format3.py"))["tree"]()
    ck = tmp_path / "ck"
    shutil.copytree(FORMAT3, ck)
    doc = json.loads((ck / "4" / "meta" / "metadata").read_text())
    assert doc["format"] == "jaxwise-checkpoint-3" and (ck / "4" / "state" / "data").is_file()
    like = jax.tree.map(jnp.zeros_like, tree)
    back = restore(ck, like=like)
    assert [raw(a).tobytes() for a in jax.tree.leaves(back)] == [
        raw(a).tobytes() for a in jax.tree.leaves(tree)
    ]
    assert latest_step(ck) == 4 and load_metadata(ck) == {"epoch": 2}
    assert_plain_tree(plain_restore(export_orbax(ck, tmp_path / "export")), tree)
    save(ck, tree, {"epoch": 3}, step=5)
    assert_plain_tree(plain_restore(ck / "5" / "state"), tree)
    assert restore(ck, like=like, step=4)["count"].tolist() == 7


def test_a_damaged_single_file_step_of_before_is_refused_by_name(tmp_path):
    ck = tmp_path / "ck"
    shutil.copytree(FORMAT3, ck)
    data = ck / "4" / "state" / "data"
    blob = bytearray(data.read_bytes())
    blob[0] ^= 0x01
    data.write_bytes(bytes(blob))
    tree = runpy.run_path(str(FORMAT3.parent / "make_checkpoint_format3.py"))["tree"]()
    with pytest.raises(CheckpointError, match="step 4 .* is damaged: `.*` fails its checksum"):
        restore(ck, like=tree, step=4)


def test_a_step_is_orbaxs_layout_in_a_handful_of_files(tmp_path):
    """One OCDBT store (a manifest and one data file) whatever the number of leaves: no
    directory per leaf, no TensorStore lock files, the sealed metadata beside it."""
    save(tmp_path / "ck", {f"w{i}": jnp.full(3, float(i)) for i in range(20)}, step=1)
    step = tmp_path / "ck" / "1"
    files = sorted(str(p.relative_to(step)) for p in step.rglob("*") if p.is_file())
    (data,) = (step / "state" / "d").iterdir()
    assert files == sorted(
        ["meta/metadata", "state/_METADATA", "state/_sharding", "state/manifest.ocdbt"]
        + [str(data.relative_to(step))]
    )
    meta = json.loads((step / "state" / "_METADATA").read_text())
    assert meta["use_ocdbt"] is True and len(meta["tree_metadata"]) == 20


def test_an_edited_zarr_header_inside_the_store_is_a_damaged_step(tmp_path):
    """A ``.zarray`` that no longer describes the leaf (plain orbax would read other bytes)."""
    import tensorstore as ts

    ck = tmp_path / "ck"
    save(ck, {"w": jnp.ones(4)}, step=1)
    save(ck, {"w": jnp.full(4, 2.0)}, step=2)
    store = ts.KvStore.open(
        {"driver": "ocdbt", "base": {"driver": "file", "path": f"{ck / '2' / 'state'}/"}}
    ).result()
    header = json.loads(store["w/.zarray"])
    store["w/.zarray"] = json.dumps({**header, "dtype": "<i4"}).encode()
    with pytest.warns(CheckpointWarning, match=r"step 2 \(the zarr metadata of `w` differs"):
        assert restore(ck, like={"w": jnp.zeros(4)})["w"].tolist() == [1.0] * 4


def test_plain_orbax_reads_many_leaves_with_shared_prefixes_and_unicode_keys(tmp_path):
    """The store's one B+tree node: keys sorted as bytes, prefix-compressed, every value out
    of line (UTF-8 keys, keys that extend one another, 300 leaves)."""
    tree = {
        "layer": {f"{i:03d}": jnp.full((2,), float(i)) for i in range(150)},
        "layer_norm": {"scale": jnp.ones(3), "scale_b": jnp.zeros(3)},
        "größe": {f"ß{i}": jnp.asarray([i], jnp.int32) for i in range(148)},
    }
    save(tmp_path / "ck", tree, step=2)
    assert_plain_tree(plain_restore(tmp_path / "ck" / "2" / "state"), tree)


READ_WITHOUT_JAXWISE = """
import sys
import numpy as np
import orbax.checkpoint as ocp

with ocp.StandardCheckpointer() as plain:
    tree = plain.restore(sys.argv[1])
assert not any(name.startswith("jaxwise") for name in sys.modules), "jaxwise was imported"
np.savez(sys.argv[2], w=np.asarray(tree["enc"]["w"]), b=np.asarray(tree["enc"]["b"]),
         key=np.asarray(tree["key"]))
"""


@pytest.mark.slow
def test_a_process_that_never_imports_jaxwise_reads_a_step(tmp_path):
    import subprocess
    import sys

    tree = {
        "enc": {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)},
        "key": jax.random.key(7),
    }
    save(tmp_path / "ck", tree, step=1)
    out = tmp_path / "read.npz"
    proc = subprocess.run(
        [sys.executable, "-c", READ_WITHOUT_JAXWISE, str(tmp_path / "ck" / "1" / "state"), out],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    assert got["w"].tobytes() == raw(tree["enc"]["w"]).tobytes()
    assert got["b"].tobytes() == raw(tree["enc"]["b"]).tobytes()
    assert got["key"].tobytes() == raw(tree["key"]).tobytes()

"""Nothing lost, nothing silently wrong, sixth round (issue 50): the next attack extends this.

Each test is one finding: the exact call that lost data or answered wrong, and its answer now
(a refusal by name, or the right result). Data loss first, then silent wrong results.
"""

import json
import os
import signal
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise import optim
from jaxwise.metrics import JsonlWriter, TensorBoardWriter
from jaxwise.train import Checkpointing, Resume, ResumeError, TrainState, fit, make_train_step
from jaxwise.train._loop._data_state import DataPosition
from jaxwise.train._loop._fingerprint import fingerprint

# ----------------------------------------------------------------------------- data loss


def test_two_jsonl_writers_on_one_path_the_second_is_refused(tmp_path):
    """Was: ``b``'s first write rewrote the file, and every line ``a`` wrote was gone."""
    path = tmp_path / "m.jsonl"
    a = JsonlWriter(path)
    with pytest.raises(ValueError, match=r"JsonlWriter\(.*m\.jsonl'\): already open in another "):
        JsonlWriter(path)
    a.write(1, {"a": 1.0})
    a.write(2, {"a": 2.0})
    a.close()
    with JsonlWriter(path) as b:  # once `a` is closed, a resumed writer continues the file
        b.write(3, {"b": 3.0})
    assert [json.loads(line) for line in path.read_text().splitlines()] == [
        {"step": 1, "a": 1.0},
        {"step": 2, "a": 2.0},
        {"step": 3, "b": 3.0},
    ]


def test_two_tensorboard_writers_on_one_logdir_the_second_is_refused(tmp_path):
    """Was: the second one's restart marker hid every event of the first from TensorBoard."""
    pytest.importorskip("tensorboardX")
    a = TensorBoardWriter(tmp_path)
    with pytest.raises(ValueError, match=r"TensorBoardWriter\(.*\): already open in another "):
        TensorBoardWriter(tmp_path)
    a.close()
    TensorBoardWriter(tmp_path).close()


HOLDER = """
import sys
from jaxwise.metrics import JsonlWriter
w = JsonlWriter(sys.argv[1])
w.write(1, {"a": 1.0})
w.flush()
print("open", flush=True)
sys.stdin.readline()  # held until the parent says so
"""


def test_a_writer_in_another_process_is_named_and_its_death_releases_the_path(tmp_path):
    path = tmp_path / "m.jsonl"
    command = [sys.executable, "-c", HOLDER, str(path)]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) as p:
        try:
            assert p.stdout is not None and p.stdout.readline() == "open\n"
            with pytest.raises(ValueError, match=rf"already open in process {p.pid} on host "):
                JsonlWriter(path)
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait(timeout=60)
    with JsonlWriter(path) as w:  # the kill released it: the resumed run continues the file
        w.write(2, {"a": 2.0})
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2]


def test_a_forgotten_writer_releases_its_path_when_collected(tmp_path):
    path = tmp_path / "m.jsonl"
    w = JsonlWriter(path)
    del w  # never closed
    with JsonlWriter(path) as again:
        again.write(2, {"a": 2.0})
    assert not os.path.exists(tmp_path / ".m.jsonl.jaxwise-lock")


# ----------------------------------------------------------------------------- silent wrong results


def _loss(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] - y) ** 2)


def _batches(n=10, changed=None):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        x = rng.normal(size=(4, 3)).astype(np.float32)
        if i == changed:
            x = x.copy()
            x[1, 2] += 1.0  # one value of one batch
        out.append((x, x @ np.asarray([1.0, -2.0, 0.5], np.float32)))
    return out


def _fit(root, batches, *, steps=None, resume=False):
    """``fit`` over ``batches`` checkpointing every 4 into ``root`` (continuing it: ``resume``)."""
    pytest.importorskip("orbax.checkpoint")
    from jaxwise.checkpoint import Checkpointer, latest_step, load_metadata, restore

    state = TrainState.create({"w": jnp.zeros(3)}, optim.adam(0.1), 0)
    meta = None
    if resume:
        step = latest_step(root)
        state = restore(root, state, step)
        meta = load_metadata(root, step)
    with Checkpointer(root, async_save=False) as ck:
        callbacks = [Checkpointing(ck, every=4)]
        return fit(
            make_train_step(_loss), state, batches, steps=steps, resume=meta, callbacks=callbacks
        )


def test_a_resume_over_a_list_whose_trained_batch_changed_is_refused(tmp_path):
    """Was: only the length and batch 0 were compared; batch 6 (trained) changed, accepted."""
    _fit(tmp_path / "ck", _batches(), steps=8)  # saved at 4 and 8
    with pytest.raises(ResumeError, match=r"trained on other batches 0\.\.7 \(their chained hash"):
        _fit(tmp_path / "ck", _batches(changed=6), resume=True)


def test_a_resume_over_a_list_checks_only_what_was_trained(tmp_path):
    """Batch 9 is not trained yet at step 8: changing it continues the run (not other data)."""
    _fit(tmp_path / "a", _batches(), steps=8)
    state, report = _fit(tmp_path / "a", _batches(changed=9), resume=True)
    assert report.steps == 2 and int(state.step) == 10
    _fit(tmp_path / "b", _batches(), steps=8)  # the same list resumes, as if never stopped
    resumed, _ = _fit(tmp_path / "b", _batches(), resume=True)
    whole, _ = _fit(tmp_path / "c", _batches())
    np.testing.assert_array_equal(resumed.params["w"], whole.params["w"])


def test_an_old_checkpoints_fingerprint_still_resumes(tmp_path):
    """A fifth-round checkpoint's record (length and first hash, no chain) is checked on those."""
    first = _batches()
    old = {"fit": {"batches": 8, "fingerprint": fingerprint(first)}}
    del old["fit"]["fingerprint"]["first"]  # as if saved before the key existed: still fine
    position = DataPosition.start(first, Resume(old), 0, saving=True)
    np.testing.assert_array_equal(next(iter(position.source))[0], first[8][0])
    position.consumed()
    assert position.saved(9)["trained"]["from"] == 8  # a new chain from where it resumed
    with pytest.raises(ResumeError, match="length 10 \\(now 9\\)"):
        DataPosition.start(first[:9], Resume(old), 0)


def _grain_pipeline(records, seed=0):
    grain = pytest.importorskip("grain")
    ds = grain.MapDataset.source(records).shuffle(seed=seed).batch(8)
    return ds.to_iter_dataset()


def _records(changed=None):
    rows = [np.full(3, i, np.float32) for i in range(64)]
    if changed is not None:
        rows[changed] = rows[changed] + 0.5
    return [(r, r.sum()) for r in rows]


@pytest.mark.parametrize(
    "other, found",
    [
        (lambda: _grain_pipeline(_records(changed=40)), "sampled-records hash"),
        (lambda: _grain_pipeline(_records(), seed=1), r"step \d \(ShuffleMapDataset\) has seed 0"),
    ],
    ids=["record-40-of-64", "shuffle-seed-1"],
)
def test_a_resume_over_another_grain_pipeline_is_refused(tmp_path, other, found):
    """Was: a grain source was seen by its length and record 0 only; the seeds not at all."""
    _fit(tmp_path / "ck", _grain_pipeline(_records()), steps=4)
    with pytest.raises(ResumeError, match=found):
        _fit(tmp_path / "ck", other(), resume=True)
    _fit(tmp_path / "ck", _grain_pipeline(_records()), resume=True)  # the same one resumes


def test_a_grain_dataloaders_sampler_seed_and_operations_are_in_its_fingerprint():
    grain = pytest.importorskip("grain")
    from jaxwise.train._loop._fingerprint import mismatch

    def loader(seed=0, batch=8, threads=16):
        sampler = grain.samplers.IndexSampler(
            64, shard_options=grain.sharding.NoSharding(), shuffle=True, seed=seed, num_epochs=1
        )
        return grain.DataLoader(
            data_source=_records(),  # pyright: ignore[reportArgumentType]
            sampler=sampler,
            operations=[grain.transforms.Batch(batch)],
            worker_count=0,
            read_options=grain.ReadOptions(num_threads=threads),
        )

    saved = fingerprint(loader())
    assert mismatch(saved, fingerprint(loader(seed=1))) == (
        "a grain pipeline whose step 0 (IndexSampler) has seed 0 (now 1)"
    )
    assert "step 1 (Batch) has batch_size 8 (now 4)" in str(
        mismatch(saved, fingerprint(loader(batch=4)))
    )
    assert mismatch(saved, fingerprint(loader(threads=2))) is None  # performance, not order

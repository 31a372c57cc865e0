"""A saved data position given to another kind of grain pipeline: a named error, not grain's.

A grain ``DataLoader`` keeps its position as bytes, an ``IterDataset`` iterator as a dict;
handed the other's, grain fails deep inside (``'dict' object has no attribute 'decode'``).
"""

import base64

import numpy as np
import pytest

from jaxwise.train import Resume, ResumeError
from jaxwise.train._loop._data_state import DataPosition

grain = pytest.importorskip("grain")

X = np.arange(64, dtype=np.float32).reshape(32, 2)


def _dataset():
    return grain.MapDataset.source(X).batch(4).to_iter_dataset()


def _loader():
    sampler = grain.samplers.IndexSampler(
        32, shard_options=grain.sharding.NoSharding(), shuffle=False, seed=0, num_epochs=1
    )
    return grain.DataLoader(
        data_source=X,  # pyright: ignore[reportArgumentType]  # an array is a random-access source
        sampler=sampler,
        operations=[grain.transforms.Batch(4)],
        worker_count=0,
    )


def _saved_after(batches, n):
    it = iter(batches)
    for _ in range(n):
        next(it)
    state = it.get_state()
    data = (
        {"bytes": base64.b64encode(state).decode("ascii")}
        if isinstance(state, bytes)
        else {"json": state}
    )
    return Resume({"fit": {"batches": n, "data": data}})


@pytest.mark.parametrize(
    "saved_by, resumed_with, found",
    [(_dataset, _loader, "dict with keys ['next_index']"), (_loader, _dataset, "(bytes)")],
)
def test_a_position_of_another_kind_of_pipeline_is_refused_by_name(saved_by, resumed_with, found):
    saved = _saved_after(saved_by(), 2)
    with pytest.raises(ResumeError, match="another kind of pipeline") as err:
        DataPosition.start(resumed_with(), saved, 0)
    assert found in str(err.value) and "`Resume`" in str(err.value)


@pytest.mark.parametrize("make", [_dataset, _loader])
def test_the_same_pipeline_resumes_at_its_position(make):
    saved = _saved_after(make(), 2)
    position = DataPosition.start(make(), saved, 0)
    np.testing.assert_array_equal(next(iter(position.source)), X[8:12])


def test_a_position_grain_rejects_is_reported_by_name():
    saved = Resume({"fit": {"batches": 2, "data": {"json": {"next_index": "two"}}}})
    with pytest.raises(ResumeError, match="set_state failed"):
        DataPosition.start(_dataset(), saved, 0)

"""The CLI's training jobs run on `train.fit`: same models as before, writers, resume, kills.

``tests/data/cli_golden.npz`` holds the final parameters the jobs trained with their own
epoch loop (``jobs/_loop.py``, commit 96af08f), written by ``tests/data/make_cli_golden.py``.
"""

import sys
from pathlib import Path

import numpy as np
import pytest

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(DATA))
import make_cli_golden as golden  # noqa: E402  # pyright: ignore[reportMissingImports]

GOLDEN = np.load(DATA / "cli_golden.npz")


def _expected(name: str) -> list[np.ndarray]:
    count = sum(1 for key in GOLDEN.files if key.startswith(f"{name}/"))
    return [GOLDEN[f"{name}/{i}"] for i in range(count)]


@pytest.mark.parametrize("name", sorted(golden.CONFIGS))
def test_the_train_job_trains_the_same_model_as_before_for_the_same_seed(tmp_path, name):
    csv_path = golden.blobs_csv(tmp_path / "blobs.csv")
    got = golden.train_params(csv_path, tmp_path / name, golden.CONFIGS[name])
    want = _expected(name)
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_the_spiral_job_trains_the_same_model_as_before_for_the_same_seed():
    got, want = golden.spiral_params(), _expected("spiral")
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)

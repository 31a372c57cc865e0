"""Nothing lost, nothing silently wrong, sixth round (issue 50): the next attack extends this.

Each test is one finding: the exact call that lost data or answered wrong, and its answer now
(a refusal by name, or the right result). Data loss first, then silent wrong results.
"""

import json
import os
import signal
import subprocess
import sys

import pytest

from jaxwise.metrics import JsonlWriter, TensorBoardWriter

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

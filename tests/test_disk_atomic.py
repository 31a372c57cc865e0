"""The one disk-full detector (``jaxwise._shared._disk``) and the one atomic write
(``jaxwise._shared._atomic``)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from jaxwise._shared._atomic import atomic_write, atomic_write_text, temporary_name
from jaxwise._shared._disk import disk_full_error, is_disk_full, naming


def _raised_from(inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as err:
            raise RuntimeError("the write failed") from err
    except RuntimeError as outer:
        return outer


@pytest.mark.parametrize(
    "err",
    [
        OSError(errno.ENOSPC, "No space left on device"),
        OSError(errno.EDQUOT, "Disk quota exceeded"),
        _raised_from(OSError(errno.ENOSPC, "x")),
        ValueError("RESOURCE_EXHAUSTED: writing \"/ck/2\": [os_error_code='28']"),
        RuntimeError("tensorstore: No space left on device"),
    ],
    ids=["enospc", "edquot", "chained", "orbax-code", "text"],
)
def test_is_disk_full_recognises_every_form(err):
    assert is_disk_full(err)


@pytest.mark.parametrize(
    "err",
    [
        OSError(errno.EACCES, "Permission denied"),
        ValueError("bad value"),
        _raised_from(OSError(errno.ENOENT, "No such file")),
    ],
    ids=["eacces", "value", "chained-enoent"],
)
def test_is_disk_full_refuses_other_errors(err):
    assert not is_disk_full(err)


def test_is_disk_full_terminates_on_a_cycle():
    a, b = ValueError("a"), ValueError("b")
    a.__context__, b.__context__ = b, a
    assert not is_disk_full(a)


def test_disk_full_error_and_naming_name_the_target():
    err = disk_full_error(Path("/run/ck/2"), " (needs 3 MB)")
    assert (err.errno, err.strerror, err.filename) == (
        errno.ENOSPC,
        "No space left on device (needs 3 MB)",
        "/run/ck/2",
    )
    quota = naming(OSError(errno.EDQUOT, "Disk quota exceeded", "/run/.tmp"), "/run/out.csv")
    assert (quota.errno, quota.strerror, quota.filename) == (
        errno.EDQUOT,
        "No space left on device",
        "/run/out.csv",
    )
    denied = naming(OSError(errno.EACCES, "Permission denied", "/run/.tmp"), "/run/out.csv")
    assert isinstance(denied, PermissionError) and denied.filename == "/run/out.csv"
    plain = OSError("no errno")
    assert naming(plain, "x") is plain


def test_atomic_write_replaces_and_leaves_nothing(tmp_path):
    path = tmp_path / "page.html"
    assert atomic_write_text(path, "one") == path
    assert atomic_write_text(str(path), "two") == path
    assert path.read_text() == "two" and os.listdir(tmp_path) == ["page.html"]
    tmp = temporary_name(path)
    assert (
        tmp.parent == tmp_path
        and tmp.name.startswith(".page.html.")
        and tmp != (temporary_name(path))
    )


def test_a_failed_write_keeps_the_old_file_and_names_the_target(tmp_path):
    path = tmp_path / "loss.png"
    path.write_bytes(b"old")

    def half_then_full(tmp: Path) -> None:
        tmp.write_bytes(b"half a pic")
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    with pytest.raises(OSError) as info:
        atomic_write(path, half_then_full)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["loss.png"]


def test_a_non_os_error_propagates_and_cleans_up(tmp_path):
    path = tmp_path / "x.txt"

    def broken(tmp: Path) -> None:
        tmp.write_text("partial")
        raise KeyError("bug")

    with pytest.raises(KeyError):
        atomic_write(path, broken)
    assert os.listdir(tmp_path) == []


def test_a_missing_directory_names_the_target(tmp_path):
    path = tmp_path / "nowhere" / "x.txt"
    with pytest.raises(FileNotFoundError) as info:
        atomic_write_text(path, "x")
    assert info.value.filename == str(path)


def test_a_real_full_disk(tmpfs):
    disk = tmpfs("1m")
    path = disk / "report.html"
    path.write_text("the old report")
    with pytest.raises(OSError) as info:
        atomic_write_text(path, "x" * (2 << 20))  # 2 MiB on a 1 MiB disk
    assert is_disk_full(info.value)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(path))
    assert path.read_text() == "the old report" and os.listdir(disk) == ["report.html"]

"""The exception hierarchy: every jaxwise exception is a `JaxwiseError` and keeps its old base."""

from __future__ import annotations

import argparse
import importlib
import pkgutil

import pytest

import jaxwise
from jaxwise import cli
from jaxwise._errors import JaxwiseError, MissingExtraError
from jaxwise._shared._extras import require

# every jaxwise exception -> the built-in base it had before `JaxwiseError` existed (or, for
# a newer one, the built-in base it was born with)
OLD_BASES: dict[str, type[Exception]] = {
    "jaxwise.MissingExtraError": ImportError,
    "jaxwise.checkpoint.CheckpointError": ValueError,
    "jaxwise.checkpoint._steps.Foreign": ValueError,
    "jaxwise.checkpoint._format.Damaged": ValueError,
    "jaxwise.compilation.CompileBudgetExceeded": RuntimeError,
    "jaxwise.data.DataError": ValueError,
    "jaxwise.cli._jobs.RunFailed": Exception,
    "jaxwise.cli._jobs.UserError": Exception,
    "jaxwise._shared._lock.LockHeld": Exception,
    "jaxwise.lint._driver.LintSkip": Exception,
    "jaxwise.lint._notebook.NotebookError": ValueError,
    "jaxwise.per_example._graph.Unsupported": Exception,
    "jaxwise.privacy.PairingError": ValueError,  # new this round: a ValueError from the start
    "jaxwise.train.DonationError": ValueError,
    "jaxwise.train.ResumeError": ValueError,  # the resume refusals were ValueErrors
}


def _import_everything() -> None:
    for info in pkgutil.walk_packages(jaxwise.__path__, "jaxwise."):
        if info.name != "jaxwise.watch.__main__":  # runs the command line when imported
            importlib.import_module(info.name)


def _jaxwise_classes(base: type[BaseException]) -> set[type[BaseException]]:
    found, todo = set(), [base]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.startswith("jaxwise") and sub not in found:
                found.add(sub)
                todo.append(sub)
    return found


def _name(cls: type[BaseException]) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


_import_everything()
SUBCLASSES = sorted(_jaxwise_classes(JaxwiseError), key=_name)


def test_every_jaxwise_exception_is_a_jaxwise_error() -> None:
    exceptions = {c for c in _jaxwise_classes(Exception) if not issubclass(c, Warning)}
    assert exceptions - {JaxwiseError} == set(SUBCLASSES)
    assert {_name(c) for c in SUBCLASSES} == set(OLD_BASES)


@pytest.mark.parametrize("cls", SUBCLASSES, ids=_name)
def test_caught_by_its_old_builtin_base(cls: type[JaxwiseError]) -> None:
    base = OLD_BASES[_name(cls)]
    with pytest.raises(base):
        raise cls.__new__(cls)  # no __init__: some take required arguments
    try:
        raise cls.__new__(cls)
    except JaxwiseError:
        pass


def test_warnings_stay_warnings() -> None:
    from jaxwise.checkpoint import CheckpointWarning

    assert issubclass(CheckpointWarning, UserWarning)
    assert not issubclass(CheckpointWarning, JaxwiseError)


def test_both_bases_are_top_level_names() -> None:
    assert jaxwise.JaxwiseError is JaxwiseError and jaxwise.MissingExtraError is MissingExtraError
    assert "JaxwiseError" in dir(jaxwise)


def test_require_raises_missing_extra_error_naming_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r"pip install 'jaxwise\[cli\]'") as info:
        require("jaxwise_no_such_module", extra="cli")
    assert isinstance(info.value, ImportError) and info.value.name == "jaxwise_no_such_module"


def _main_raising(monkeypatch: pytest.MonkeyPatch, err: BaseException) -> int:
    def run(args: argparse.Namespace) -> int:
        raise err

    parser = argparse.ArgumentParser()
    parser.set_defaults(command="lint", run=run)
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    return cli.main([])


@pytest.mark.parametrize(
    ("err", "code"),
    [
        (MissingExtraError("x needs orbax: pip install 'jaxwise[checkpoint]'"), 2),
        (JaxwiseError("a bad option"), 2),
        (RuntimeError("a bug"), 1),
    ],
)
def test_cli_recognises_errors_by_class(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], err: Exception, code: int
) -> None:
    assert _main_raising(monkeypatch, err) == code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and str(err) in lines[0]


def test_cli_keeps_a_class_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from jaxwise.cli._jobs import RunFailed

    assert _main_raising(monkeypatch, RunFailed("every step skipped")) == 1


def test_cli_does_not_match_the_install_hint_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain ImportError quoting the hint is a bug, not a missing extra."""
    assert _main_raising(monkeypatch, ImportError("pip install 'jaxwise[cli]'")) == 1

"""The core needs only jax, numpy and optax; a missing extra is one ImportError naming it.

A fresh interpreter hides every optional dependency (``sys.modules[name] = None`` makes
``import name`` fail), imports every public namespace, trains a few steps, then calls each
feature that needs an extra and records what it raised.
"""

import json
import subprocess
import sys
import textwrap

import pytest

from jaxwise._shared._extras import EXTRAS, require

HIDDEN = ("orbax", "orbax.checkpoint", "dp_accounting", "rich", "matplotlib", "flax", "equinox")

SCRIPT = textwrap.dedent(
    """
    import contextlib, io, json, sys, tempfile
    from pathlib import Path

    for name in {hidden!r}:
        sys.modules[name] = None  # `import name` now raises ImportError

    import jaxwise

    namespaces = sorted(jaxwise._SUBMODULES)
    for name in namespaces:
        getattr(jaxwise, name)  # every public namespace imports without the extras

    import jax, jax.numpy as jnp, numpy as np
    from jaxwise import optim
    from jaxwise.train import ProgressBar, TrainState, fit, make_train_epoch, make_train_step

    def loss(params, batch):
        x, y = batch
        return jnp.mean((x @ params["w"] - y) ** 2)

    x = np.random.default_rng(0).normal(size=(32, 3)).astype(np.float32)
    y = x @ np.asarray([1.0, -2.0, 0.5], np.float32)
    tx = optim.adam(0.1)
    state = TrainState.create({{"w": jnp.zeros(3)}}, tx, jax.random.key(0))
    state, metrics = make_train_step(loss)(state, (x, y))
    state, metrics = make_train_epoch(loss, batch_size=8)(state, (x, y))
    state, report = fit(make_train_step(loss), state, [(x, y)] * 3)
    out = {{"trained": [int(state.step), report.steps, bool(np.isfinite(report.losses).all())]}}
    out["loaded"] = sorted(
        name for name in {hidden!r} if sys.modules.get(name) is not None
    )

    def error(call):
        try:
            call()
        except ImportError as err:
            return str(err)
        return None

    def cli(*argv):
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = jaxwise.cli.main(list(argv))
            except SystemExit as exit:
                code = exit.code
        return [code, stdout.getvalue(), stderr.getvalue()]

    directory = tempfile.mkdtemp()
    from jaxwise import checkpoint, models, privacy
    from jaxwise.cli import _doctor as doctor, _plotting as plotting
    import jaxwise.cli

    out["checkpoint.save"] = error(lambda: checkpoint.save(directory, state))
    out["checkpoint.Checkpointer"] = error(lambda: checkpoint.Checkpointer(directory))
    out["checkpoint.restore"] = error(lambda: checkpoint.restore(directory, like=state))
    out["fit ProgressBar"] = error(
        lambda: fit(make_train_step(loss), state, [(x, y)], callbacks=[ProgressBar()])
    )
    out["privacy.epsilon"] = error(
        lambda: privacy.epsilon(noise_multiplier=1.0, sample_rate=0.01, steps=10, delta=1e-5)
    )
    out["models.from_nnx"] = error(lambda: models.from_nnx(object()))
    out["models.from_linen"] = error(lambda: models.from_linen(object(), {{}}))
    out["models.from_equinox"] = error(lambda: models.from_equinox(object()))
    out["plotting"] = error(
        lambda: plotting.plot_confusion(Path(directory) / "c.png", np.eye(2), ("a", "b"))
    )
    out["doctor"] = error(lambda: doctor.report())
    out["doctor --json"] = json.loads(doctor.report(as_json=True))["checks"] != []
    out["cli doctor"] = cli("doctor")
    lint_me = Path(directory) / "ok.py"
    lint_me.write_text("x = 1\\n")
    out["cli lint"] = cli("lint", str(lint_me))
    out["cli --version"] = cli("--version")
    print(json.dumps(out))
    """
).format(hidden=HIDDEN)

# feature -> the extra its message must name
FEATURES = {
    "checkpoint.save": "checkpoint",
    "checkpoint.Checkpointer": "checkpoint",
    "checkpoint.restore": "checkpoint",
    "fit ProgressBar": "cli",
    "privacy.epsilon": "privacy",
    "models.from_nnx": "flax",
    "models.from_linen": "flax",
    "models.from_equinox": "equinox",
    "plotting": "cli",
    "doctor": "cli",
}


@pytest.fixture(scope="module")
def without_extras():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_core_imports_and_trains_without_any_extra(without_extras):
    assert without_extras["trained"] == [1 + 4 + 3, 3, True]
    assert without_extras["loaded"] == []


@pytest.mark.slow
@pytest.mark.parametrize("feature", FEATURES)
def test_a_missing_extra_is_one_line_naming_it(without_extras, feature):
    message = without_extras[feature]
    assert message is not None, f"{feature} ran without its extra"
    assert "\n" not in message
    assert f"pip install 'jaxwise[{FEATURES[feature]}]'" in message, message


@pytest.mark.slow
def test_cli_names_the_missing_extra_and_lint_runs_without_it(without_extras):
    code, _, stderr = without_extras["cli doctor"]
    assert code == 2 and stderr.count("\n") == 1, stderr
    assert stderr.startswith("jaxwise: error: the terminal output of jaxwise doctor needs rich")
    assert stderr.endswith("pip install 'jaxwise[cli]'\n")
    assert without_extras["doctor --json"] is True
    code, stdout, stderr = without_extras["cli lint"]
    assert code == 0 and "0 finding(s)" in stderr, stderr
    code, stdout, _ = without_extras["cli --version"]
    assert code == 0 and stdout.startswith("jaxwise "), stdout


def test_require_names_module_and_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "rich", None)
    with pytest.raises(ImportError) as caught:
        require("rich", extra="cli", feature="the progress bar")
    assert str(caught.value) == (
        "the progress bar needs rich, which is not installed: pip install 'jaxwise[cli]'"
    )
    with pytest.raises(ValueError, match="`extra` must be one of"):
        require("rich", extra="gui")


def test_extras_match_pyproject():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = pyproject["project"]["optional-dependencies"]
    for extra, distributions in EXTRAS.items():
        assert [r.split(">")[0].split("=")[0] for r in extras[extra]] == list(distributions)
    assert extras["all"] == [f"jaxwise[{','.join(EXTRAS)}]"]
    assert "jaxwise[test-run]" in extras["test"] and "jaxwise[all]" in extras["test-run"]
    assert "jaxwise[all]" in extras["bench"]
    core = [r.split(">")[0].split("=")[0] for r in pyproject["project"]["dependencies"]]
    assert core == ["jax", "jaxlib", "numpy", "optax"]

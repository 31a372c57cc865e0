"""`jaxwise watch` on real scripts, run as subprocesses (slow): the script runs unchanged.

Each script is written to a temporary directory and run with ``python -m jaxwise.watch``
(and once with ``jaxwise watch`` through the console entry point); the report is read from
``--json``. Lines are found by their ``# MARK`` comments.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

NNX_STATIC_LR = """
import jax, jax.numpy as jnp, optax
from flax import nnx


class MLP(nnx.Module):
    def __init__(self, rngs):
        self.hidden = nnx.Linear(2, 8, rngs=rngs)
        self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x):
        return self.out(jax.nn.relu(self.hidden(x)))


model = MLP(nnx.Rngs(0))
optimizer = nnx.Optimizer(model, optax.sgd(1.0), wrt=nnx.Param)


@nnx.jit(static_argnames="lr")  # MARK jit
def train_step(model, optimizer, x, y, lr):
    def loss_fn(m):
        return jnp.mean((m(x) - y) ** 2)

    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, jax.tree.map(lambda g: lr * g, grads))
    return loss


x, y = jnp.ones((16, 2)), jnp.zeros((16, 1))
lr = 0.1
for epoch in range(4):
    for batch in range(3):
        loss = train_step(model, optimizer, x, y, lr=lr)  # MARK call
    lr = lr / 2  # a Python float, static: one program per value
    print(f"epoch {epoch} loss {float(loss):.4f}")
"""

NAN_IN_ONE_BATCH = """
import jax, jax.numpy as jnp, numpy as np


@jax.jit
def step(w, x):
    def loss(w):
        return jnp.mean(jnp.log(x @ w))  # MARK log

    value, grad = jax.value_and_grad(loss)(w)
    return w - 0.01 * grad, value


w = jnp.ones(2)
for i in range(6):
    x = np.full((4, 2), -1.0 if i == 3 else 1.0, np.float32)  # batch 3 is negative
    w, value = step(w, x)  # MARK call
    print("batch", i)
"""

NUMPY_VIEW_DONATION = """
import functools
import jax, jax.numpy as jnp, numpy as np


@functools.partial(jax.jit, donate_argnums=0)
def update(params, grads):
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


params = {"w": jnp.ones((3, 3)), "b": jnp.zeros(3)}
history = []
for i in range(3):
    history.append(np.asarray(params["w"]))  # a NumPy view, kept: pins the buffer
    params = update(params, {"w": jnp.ones((3, 3)), "b": jnp.ones(3)})
print("done")
"""

CLEAN_LOOP = """
import jax, jax.numpy as jnp


@jax.jit
def step(w, x):
    return w - 0.1 * jax.grad(lambda w: jnp.mean((x @ w) ** 2))(w)


w = jnp.ones(2)
for i in range(5):
    w = step(w, jnp.ones((4, 2)) * i)
print(round(float(w.sum()), 4))
"""


def _line(source, mark):
    for number, text in enumerate(source.splitlines(), 1):
        if text.rstrip().endswith(f"# MARK {mark}"):
            return number
    raise AssertionError(mark)


def watch(tmp_path, source, *options, script_args=(), module=True):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(source).lstrip())
    report = tmp_path / "report.json"
    command = (
        [sys.executable, "-m", "jaxwise.watch"]
        if module
        else [os.path.join(os.path.dirname(sys.executable), "jaxwise"), "watch"]
    )
    proc = subprocess.run(
        [*command, "--json", str(report), *options, "train.py", *script_args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    document = json.loads(report.read_text()) if report.exists() else None
    return proc, document


def test_nnx_static_learning_rate_recompiles_every_epoch(tmp_path):
    source = textwrap.dedent(NNX_STATIC_LR).lstrip()
    proc, report = watch(tmp_path, source, "--fail-on", "recompile")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].startswith("epoch 0 loss ")
    assert len(proc.stdout.splitlines()) == 4  # the script's own output, untouched
    assert report is not None
    (step,) = report["functions"]
    call = f"train.py:{_line(source, 'call')}"
    assert (step["name"], step["where"], step["calls"], step["compiles"]) == (
        "train_step",
        f"train.py:{_line(source, 'jit')}",
        12,
        4,
    )
    assert [
        (m["kind"], m["argument"], m["old"], m["new"], m["where"], m["steady_state"])
        for m in step["misses"]
    ] == [
        ("first", "", "", "", call, False),
        ("static", "lr", "0.1", "0.05", call, False),
        ("static", "lr", "0.05", "0.025", call, True),
        ("static", "lr", "0.025", "0.0125", call, True),
    ]
    assert report["exit_code"] == 3 and report["nans"] == [] and report["donations"] == []
    assert "steady-state recompile of `train_step`" in proc.stderr
    assert "--fail-on recompile" in proc.stderr


def test_nan_from_log_of_a_negative_batch_is_located_and_stops(tmp_path):
    source = textwrap.dedent(NAN_IN_ONE_BATCH).lstrip()
    proc, report = watch(tmp_path, source, "--nans")
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["batch 0", "batch 1", "batch 2"]  # stopped in batch 3
    assert report is not None
    assert report["nans"] == [
        {
            "function": "step",
            "primitive": "log",
            "phase": "forward",
            "where": f"train.py:{_line(source, 'log')}",
        }
    ]
    assert "stopped at the first NaN" in proc.stderr
    reported, report = watch(tmp_path, source, "--nans=report")
    assert reported.returncode == 0 and len(reported.stdout.splitlines()) == 6
    assert report is not None
    assert [n["primitive"] for n in report["nans"]] == ["log"]


def test_donated_buffer_kept_alive_by_a_numpy_view(tmp_path):
    proc, report = watch(tmp_path, NUMPY_VIEW_DONATION, "--fail-on", "donation")
    assert proc.returncode == 3 and proc.stdout == "done\n", proc.stderr[-3000:]
    assert report is not None
    (finding,) = report["donations"]
    assert (finding["function"], finding["argument"]) == ("update", "params['w']")
    assert "NumPy view" in finding["cause"]


def test_clean_loop_flags_nothing(tmp_path):
    # with NaN checking on, `step` compiles once: the NaN check's imports (which define JAX
    # config options, part of every cache key) happen before the script runs
    proc, report = watch(tmp_path, CLEAN_LOOP, "--fail-on", "recompile,nan,donation", module=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("\n") == 1 and float(proc.stdout) < 2.0  # the script's line only
    assert report is not None
    (step,) = report["functions"]
    assert (step["calls"], step["compiles"]) == (5, 1)
    assert report["nans"] == [] and report["donations"] == [] and report["exit_code"] == 0
    assert "nothing flagged" in proc.stderr


def test_script_exit_codes_and_exceptions_are_preserved(tmp_path):
    proc, report = watch(
        tmp_path, "import sys\nprint(sys.argv[1:])\nsys.exit(5)\n", script_args=("a", "--b")
    )
    assert report is not None
    assert (proc.returncode, proc.stdout, report["exit_code"]) == (5, "['a', '--b']\n", 5)
    proc, report = watch(tmp_path, "def f():\n    raise ValueError('boom')\n\nf()\n")
    assert report is not None
    assert proc.returncode == 1 and report["exit_code"] == 1
    assert 'train.py", line 2, in f' in proc.stderr and "ValueError: boom" in proc.stderr
    assert "runpy" not in proc.stderr and "jaxwise" not in proc.stderr.split("ValueError")[0]
    missing = subprocess.run(
        [sys.executable, "-m", "jaxwise.watch", "nowhere.py"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert missing.returncode == 2 and "no such script: nowhere.py" in missing.stderr


def test_the_documented_walk_through(tmp_path):
    # docs/watch.md shows these reports: the example's three pitfalls, each found at its line
    example = Path(__file__).parents[1] / "examples" / "watch_nnx_pitfalls.py"
    source = example.read_text()
    lines = {
        mark: source.splitlines().index(next(x for x in source.splitlines() if mark in x)) + 1
        for mark in ("@nnx.jit", "jnp.log(x)", "loss = train_step(")
    }
    proc, report = watch(tmp_path, source)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert report is not None
    (step,) = report["functions"]
    assert (step["where"], step["calls"], step["compiles"]) == (
        f"train.py:{lines['@nnx.jit']}",
        24,
        4,
    )
    steady = [
        (m["kind"], m["argument"], m["old"], m["new"]) for m in step["misses"] if m["steady_state"]
    ]
    assert steady == [("static", "lr", "0.05", "0.025"), ("static", "lr", "0.025", "0.0125")]
    assert [(d["function"], d["argument"]) for d in report["donations"]] == [
        ("train_step", "model.out.kernel")
    ]
    proc, report = watch(tmp_path, source, "--nans")
    assert proc.returncode == 3 and "epoch 3" not in proc.stdout
    assert report is not None
    assert report["nans"] == [
        {
            "function": "train_step",
            "primitive": "log",
            "phase": "forward",
            "where": f"train.py:{lines['jnp.log(x)']}",
        }
    ]

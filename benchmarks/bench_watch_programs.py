"""``jaxwise watch SCRIPT`` against ``python SCRIPT`` on whole small programs (targets: start-up
≤ 0.1 s over plain, ≤ 1.08× on a script of 10,000 small jitted calls: the kernel
least-squares steps).

Each program is a script written to a temporary directory and run as a subprocess, plain and
watched in turn (round-robin), several times; the table gives the medians. *Whole process* is
the wall time of the process; *loop* is the time the script measures itself around its steady
loop (after its first, compiling, call), so that start-up is left out of the per-call ratio.
Bytecode is cached (``PYTHONPYCACHEPREFIX``), as for an installed package. The section is
written into ``results/watch.md`` after the per-loop section of ``bench_watch.py``.
"""

import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from common import QUICK, RESULTS_DIR, environment_line, main_guard, table

RUNS = 3 if QUICK else 7
HEADING = "## `jaxwise watch` on whole programs"

_TIMER = """
import time as _time
def _loop(run, n, tag="LOOP"):
    run()  # compiles
    t, c = _time.perf_counter(), _time.process_time()
    for _ in range(n):
        out = run()
    jax.block_until_ready(out)
    print(tag, _time.perf_counter() - t, _time.process_time() - c)
"""

PROGRAMS = {
    "imports jax only": "import jax\n",
    "10,000 small jitted calls": _TIMER.join(
        [
            "import jax, jax.numpy as jnp\n",
            """
f = jax.jit(lambda x: x + 1.0)
x = jnp.ones(4)
_loop(lambda: f(x), 10_000)
class _Bare:  # the floor: any Python-level wrapper of a jitted function costs this much
    def __init__(self, f):
        self.f = f
    def __call__(self, *args, **kwargs):
        return self.f(*args, **kwargs)
g = _Bare(jax.jit(lambda x: x + 2.0))
_loop(lambda: g(x), 10_000, "BARE")
""",
        ]
    ),
    "10,000 kernel least-squares steps": _TIMER.join(
        [
            "import jax, jax.numpy as jnp\n",
            """
x = jnp.linspace(-3.0, 3.0, 64)[:, None]; y = jnp.sin(3.0 * x[:, 0])
gram = jnp.exp(-0.5 * (x - x.T) ** 2 / 0.09) + 1e-3 * jnp.eye(64)
@jax.jit
def step(alpha, gram, y):
    return alpha - 0.05 * (gram.T @ (gram @ alpha - y))
box = [jnp.zeros(64)]
def run():
    box[0] = step(box[0], gram, y)
    return box[0]
_loop(run, 10_000)
""",
        ]
    ),
    "MLP training loop (Optax Adam, 500 steps)": _TIMER.join(
        [
            "import jax, jax.numpy as jnp, optax\n",
            """
k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
x = jax.random.normal(k1, (256, 8)); y = jnp.sin(x.sum(1, keepdims=True))
params = {"w1": 0.3 * jax.random.normal(k2, (8, 32)), "w2": 0.3 * jax.random.normal(k3, (32, 1))}
tx = optax.adam(1e-2); box = [params, tx.init(params)]
@jax.jit
def step(params, opt_state, x, y):
    loss = lambda p: jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)
    g = jax.grad(loss)(params)
    updates, opt_state = tx.update(g, opt_state)
    return optax.apply_updates(params, updates), opt_state
def run():
    box[0], box[1] = step(box[0], box[1], x, y)
    return box[0]
_loop(run, 500)
""",
        ]
    ),
    "GP regression (marginal likelihood, 300 steps)": _TIMER.join(
        [
            "import jax, jax.numpy as jnp\n",
            """
x = jnp.linspace(0, 5, 64)[:, None]; y = jnp.sin(x[:, 0])
def nll(theta):
    ls, amp, noise = jnp.exp(theta)
    k = amp * jnp.exp(-0.5 * ((x - x.T) / ls) ** 2) + (noise + 1e-4) * jnp.eye(64)
    c = jnp.linalg.cholesky(k)
    a = jax.scipy.linalg.cho_solve((c, True), y)
    return 0.5 * y @ a + jnp.log(jnp.diag(c)).sum()
step = jax.jit(lambda t: t - 0.01 * jax.grad(nll)(t))
box = [jnp.zeros(3)]
def run():
    box[0] = step(box[0])
    return box[0]
_loop(run, 300)
""",
        ]
    ),
    "VAE step (donated params, 300 steps)": _TIMER.join(
        [
            "import jax, jax.numpy as jnp\n",
            """
k = jax.random.split(jax.random.key(0), 3)
images = jax.random.uniform(k[0], (64, 28 * 28))
params = {"enc": 0.01 * jax.random.normal(k[1], (784, 8)),
          "dec": 0.01 * jax.random.normal(k[2], (4, 784))}
def loss(p, images, key):
    h = images @ p["enc"]; mean, log_var = h[:, :4], h[:, 4:]
    z = mean + jnp.exp(0.5 * log_var) * jax.random.normal(key, mean.shape)
    recon = jax.nn.sigmoid(z @ p["dec"])
    kl = -0.5 * jnp.sum(1 + log_var - mean ** 2 - jnp.exp(log_var))
    return jnp.mean((recon - images) ** 2) + kl / images.shape[0]
@jax.jit
def _step(p, images, key):
    g = jax.grad(loss)(p, images, key)
    return jax.tree.map(lambda a, b: a - 1e-3 * b, p, g)
step = jax.jit(_step, donate_argnums=0)
box = [params, jax.random.key(1)]
def run():
    box[1], sub = jax.random.split(box[1])
    box[0] = step(box[0], images, sub)
    return box[0]
_loop(run, 300)
""",
        ]
    ),
}


def _time(command, cwd, env):
    """Whole-process wall seconds, and the script's ``LOOP`` and ``BARE`` (wall, CPU) lines."""
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=True)
    whole = time.perf_counter() - start
    lines = {}
    for line in proc.stdout.splitlines():
        tag, *numbers = line.split() or [""]
        if tag in ("LOOP", "BARE"):
            lines[tag] = tuple(float(n) for n in numbers)
    return whole, lines.get("LOOP"), lines.get("BARE")


def measure(source, workdir):
    script = Path(workdir) / "program.py"
    script.write_text(textwrap.dedent(source))
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(Path(workdir) / "pycache"))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    jaxwise = os.path.join(os.path.dirname(sys.executable), "jaxwise")
    commands = {"plain": [sys.executable, str(script)], "watched": [jaxwise, "watch", str(script)]}
    samples = {name: [] for name in commands}
    _time(commands["plain"], workdir, env)  # fills the bytecode cache
    _time(commands["watched"], workdir, env)
    for _ in range(RUNS):
        for name, command in commands.items():
            samples[name].append(_time(command, workdir, env))

    def median_of(runs, index):
        if runs[0][index] is None:
            return None
        return tuple(statistics.median(r[index][i] for r in runs) for i in range(2))

    return {
        name: (statistics.median(r[0] for r in runs), median_of(runs, 1), median_of(runs, 2))
        for name, runs in samples.items()
    }


def _write(body):
    path = RESULTS_DIR / "watch.md"
    text = path.read_text() if path.exists() else ""
    text = text.split(HEADING)[0].rstrip()
    path.write_text(f"{text}\n\n{HEADING}\n\n_{environment_line()}_\n\n{body.strip()}\n")
    print(path.read_text())


def _loops(plain, watched):
    """``"a ms → b ms (r×)"`` for the loop's wall and CPU times, or dashes without a loop."""
    if plain is None or watched is None:
        return ["–", "–"]
    return [f"{p * 1e3:.1f} ms → {w * 1e3:.1f} ms ({w / p:.3f}×)" for p, w in zip(plain, watched)]


def run():
    rows = []
    floor = ""
    with tempfile.TemporaryDirectory() as workdir:
        for title, source in PROGRAMS.items():
            m = measure(source, workdir)
            (pw, pl, bare), (ww, wl, _) = m["plain"], m["watched"]
            rows.append([title, f"{pw:.3f} s", f"{ww:.3f} s", f"{ww - pw:+.3f} s", *_loops(pl, wl)])
            if bare is not None and pl is not None:
                floor = (
                    " The floor: in the same plain runs, the 10,000 calls through a bare Python "
                    "wrapper (an object whose `__call__` only forwards `*args, **kwargs`) took "
                    f"{bare[0] / pl[0]:.3f}× (wall) and {bare[1] / pl[1]:.3f}× (CPU) the direct "
                    "calls: what any Python-level wrapper of a ~5 µs call costs before doing "
                    "anything."
                )
    _write(
        table(
            [
                "program",
                "plain, whole",
                "watched, whole",
                "added",
                "loop wall: plain → watched",
                "loop CPU: plain → watched",
            ],
            rows,
        )
        + f"\n\nMedians of {RUNS} round-robin runs per program, each a fresh process (plus one "
        "run each first, to fill the bytecode cache). *Loop* is timed by the script itself "
        "around its steady loop (after the first call, which compiles), in wall time and in "
        "CPU time of the process (less sensitive to the other processes of a shared machine). "
        "Targets: start-up (the first row's *added*) ≤ 0.1 s, the 10,000-call scripts ≤ 1.08×. "
        "The machine was shared (load average "
        f"{os.getloadavg()[0]:.1f} on 2 cores at the end): compare within a row." + floor
    )


if __name__ == "__main__":
    main_guard(run)

"""`Watch` on the forms of third-party programs (small copies written for the tests).

Equinox ``filter_jit`` arguments named by the user's names, a structure change named by its
argument, donation causes told apart on model code (a VAE-style step donating its images, a
live NumPy view, a duplicate), ahead-of-time and ``pmap``-ed functions, and the event channel
between ``jaxwise.train`` and the watch (no stack-frame variable names).
"""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxwise._shared import _events
from jaxwise.compilation import CacheMiss
from jaxwise.train import DonationError, TrainState, make_train_step
from jaxwise.watch import Watch, WatchReport
from jaxwise.watch._donations import DUPLICATE, HELD, NO_OUTPUT

HERE = "tests/test_watch_thirdparty.py"


def _line(marker):
    with open(__file__) as f:
        for number, text in enumerate(f, 1):
            if text.rstrip().endswith(f"# {marker}"):
                return f"{HERE}:{number}"
    raise AssertionError(marker)


def only(report: WatchReport, name: str):
    found = [f for f in report.functions if f.name == name]
    assert len(found) == 1, [(f.name, f.where) for f in report.functions]
    return found[0]


# ---------------------------------------------------------------------------
# Arguments by the user's names
# ---------------------------------------------------------------------------


def test_equinox_static_int_and_numpy_batch_named_by_the_users_arguments():
    with Watch(transfers=True) as w:

        @eqx.filter_jit  # JIT: eqx
        def step(model, xs, n):
            return jax.tree.map(lambda p: p * n, model), xs.sum()

        model = {"w": jnp.ones(3)}
        for n in range(4):
            step(model, np.ones(3, np.float32) * n, n)  # CALL: eqx
    report = w.report()
    f = only(report, "step")
    assert (f.where, f.calls, f.compiles) == (_line("JIT: eqx"), 4, 4)
    assert all(isinstance(m, CacheMiss) for m in f.misses)
    assert [(m.kind, m.argument, m.old, m.new) for m in f.misses[1:]] == [
        ("static", "n", "0", "1"),
        ("static", "n", "1", "2"),
        ("static", "n", "2", "3"),
    ]
    assert f.misses[3].call_site == _line("CALL: eqx")
    assert "static argument `n`: 2 → 3" in f.misses[3].summary
    assert report.transfers is not None
    (site,) = report.transfers
    assert (site.function, site.arguments, site.calls) == ("step", ("xs",), 4)


def test_equinox_shape_change_is_named_by_path_inside_the_argument():
    with Watch() as w:
        forward = eqx.filter_jit(lambda params, batch: params["w"] @ batch["x"])
        params = {"w": jnp.ones((2, 3))}
        for cols in (4, 5):
            forward(params, {"x": jnp.ones((3, cols))})
    miss = only(w.report(), "<lambda>").misses[1]
    assert (miss.kind, miss.argument, miss.old, miss.new) == (
        "shape",
        "batch['x']",
        "f32[3,4]",
        "f32[3,5]",
    )


def test_a_structure_change_names_the_argument_not_its_first_leaf():
    with Watch() as w:

        @jax.jit
        def f(params):
            return sum(jax.tree.leaves(params))

        f(1.0)
        f((1.0, 2.0))
        f({"a": 1.0, "b": 2.0})
        f({"a": 1.0, "b": 2.0, "c": 3.0})
    misses = only(w.report(), "f").misses
    assert [(m.kind, m.argument) for m in misses[1:]] == [
        ("structure", "params"),
        ("structure", "params"),
        ("structure", "params['c']"),
    ]


# ---------------------------------------------------------------------------
# Donation causes, on model code
# ---------------------------------------------------------------------------


def _vae_step(params, images, key):
    """One VAE step: encode, sample, decode; returns new params and the loss (no images)."""

    def loss(p):
        h = jnp.tanh(images.reshape(images.shape[0], -1) @ p["enc"])
        mean, log_var = h[:, :2], h[:, 2:]
        z = mean + jnp.exp(0.5 * log_var) * jax.random.normal(key, mean.shape)
        recon = jax.nn.sigmoid(z @ p["dec"])
        kl = -0.5 * jnp.sum(1 + log_var - mean**2 - jnp.exp(log_var))
        return jnp.mean((recon - images.reshape(recon.shape)) ** 2) + kl / images.shape[0]

    value, grads = jax.value_and_grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value


def _vae_params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {
        "enc": 0.1 * jax.random.normal(k1, (16, 4)),
        "dec": 0.1 * jax.random.normal(k2, (2, 16)),
    }


@pytest.mark.filterwarnings("ignore:Some donated buffers were not usable")
def test_vae_step_donating_images_with_no_output_of_their_type():
    params = _vae_params()
    with Watch() as w:
        step = jax.jit(_vae_step, donate_argnames=("params", "images"))
        for i in range(2):
            images = jnp.full((8, 4, 4), 0.1 * i)
            params, _ = step(params, images, jax.random.key(i))
    (finding,) = w.report().donations
    assert (finding.function, finding.argument, finding.count) == ("_vae_step", "images", 2)
    assert finding.cause == NO_OUTPUT.format(aval="float32[8,4,4]")


@pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason="a NumPy view shares a jax.Array's buffer only on CPU (elsewhere np.asarray copies)",
)
def test_vae_step_whose_params_are_held_by_a_numpy_view():
    params = _vae_params()
    view = None
    with Watch() as w:
        step = jax.jit(_vae_step, donate_argnames=("params",))
        view = np.asarray(params["dec"])  # shares the CPU buffer: JAX skips that donation
        params, _ = step(params, jnp.ones((8, 4, 4)), jax.random.key(0))
    del view
    (finding,) = w.report().donations
    assert (finding.argument, finding.cause) == ("params['dec']", HELD)


def test_the_same_buffer_donated_and_passed_again_is_a_duplicate():
    def update(w, g):
        return w - 0.1 * g, jnp.sum(g)

    with Watch() as w:
        step = jax.jit(update, donate_argnums=0)
        weights = jnp.ones(4)
        with pytest.raises(Exception, match="donated"):
            step(weights, weights)
    (finding,) = w.report().donations
    assert (finding.function, finding.argument) == ("update", "w")
    assert finding.cause == DUPLICATE.format(other="g")


# ---------------------------------------------------------------------------
# Ahead-of-time and pmap-ed functions
# ---------------------------------------------------------------------------


def test_aot_compiled_function_is_reported_with_its_calls_and_compiles():
    with Watch() as w:
        f = jax.jit(lambda x: x * 3.0)  # JIT: aot
        compiled = f.lower(jnp.ones(3)).compile()
        for _ in range(3):
            compiled(jnp.ones(3))
        f(jnp.ones(3))  # the jitted form itself: one compile more (JAX keeps two caches)
    fn = only(w.report(), "<lambda>")
    assert (fn.where, fn.calls) == (_line("JIT: aot"), 4)
    assert fn.compiles >= 1 and fn.misses[0].kind == "first"


def test_pmap_function_is_reported_with_its_calls_and_compiles():
    compiles = []

    def count(event: str, duration_secs: float, **kwargs: str | int) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration_secs)

    jax.monitoring.register_event_duration_secs_listener(count)
    out = None
    try:
        with Watch() as w:
            f = jax.pmap(lambda x: x * 2.0)  # JIT: pmap
            x = jnp.ones((jax.local_device_count(), 3))
            compiles.clear()
            for _ in range(3):
                out = f(x)
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert np.asarray(out).tolist() == [[2.0, 2.0, 2.0]] * jax.local_device_count()
    fn = only(w.report(), "<lambda>")
    assert (fn.where, fn.calls) == (_line("JIT: pmap"), 3)
    # JAX compiles the pmap once; with several devices its call also compiles JAX's own
    # `jit(_multi_slice)` (the result split per device): eager work, not the user's function
    assert fn.compiles == 1 <= len(compiles)


# ---------------------------------------------------------------------------
# The event channel: train publishes, the watch subscribes
# ---------------------------------------------------------------------------


def _loss(params, batch):
    return jnp.mean((batch["x"] @ params["w"]) ** 2)


def test_a_jaxwise_step_error_arrives_as_an_event_named_by_its_program():
    tx = optax.sgd(0.1)
    state = TrainState.create({"w": jnp.ones(2)}, tx, jax.random.key(0))
    batch = {"x": jnp.ones((4, 2))}
    step = None
    with Watch() as w:
        step = make_train_step(_loss)
        old = state
        state, _ = step(state, batch)
        with pytest.raises(DonationError, match="already deleted"):
            step(old, batch)
    assert step is not None
    (finding,) = w.report().donations
    name = step.jitted.__name__  # pyright: ignore[reportAttributeAccessIssue]  # a jitted function
    assert (finding.function, finding.argument) == (name, "state.step")
    assert finding.cause.startswith("DonationError: state: the array")


def test_an_event_without_a_function_goes_to_the_last_watched_call_whatever_the_names():
    # The old watch read `tracked` and `self.jitted` from the step's stack frames; these
    # helpers hold the jitted function under other names, and publish from another frame.
    class Renamed:
        def __init__(self):
            self.compiled_program = jax.jit(lambda s: s + 1.0)

        def __call__(self, s):
            out = self.compiled_program(s)
            _events.publish(_events.DonationFailed("", "s", ValueError("held")))
            return out

    with Watch() as w:
        runner = Renamed()
        runner(jnp.ones(2))
    (finding,) = w.report().donations
    assert (finding.function, finding.argument, finding.cause) == (
        "<lambda>",
        "s",
        "DonationError: held",
    )


def test_nan_checking_suspends_donation_through_the_channel():
    assert _events.donation_suspended() is None
    with Watch(nans="report"):
        assert _events.donation_suspended() == "jaxwise watch: NaN checking"
    assert _events.donation_suspended() is None


def test_a_donation_suspension_belongs_to_its_own_thread():
    import threading

    seen = []
    with _events.suspend_donation("replaying"):
        worker = threading.Thread(target=lambda: seen.append(_events.donation_suspended()))
        worker.start()
        worker.join()
        assert _events.donation_suspended() == "replaying"
        with _events.suspend_donation("inner"):
            assert _events.donation_suspended() == "inner"
        assert _events.donation_suspended() == "replaying"
    assert seen == [None] and _events.donation_suspended() is None

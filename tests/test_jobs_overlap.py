"""The CLI jobs' overlapped compilation: background programs, thread-aware compile tallies."""

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxwise.cli._jobs import CompileTally
from jaxwise.cli._jobs._cache import persistent_cache
from jaxwise.cli._jobs._common import initial_state
from jaxwise.cli._jobs._overlap import compile_one_shot, overlapped, precompile
from jaxwise.cli._jobs.spiral import SpiralConfig, run_spiral
from jaxwise.compilation import CompileCounter
from jaxwise.models import init_mlp


def test_precompile_in_a_background_thread_leaves_nothing_to_compile_for_the_call():
    scale = jax.jit(lambda x, w: x * w)
    x, w = jnp.ones((4, 3)), jnp.full((3,), 2.0)
    with overlapped() as background:
        background.submit(precompile, scale, jax.ShapeDtypeStruct((4, 3), jnp.float32), w)
    with CompileCounter() as counter:
        out = scale(x, w)
    assert counter.count == 0
    np.testing.assert_array_equal(np.asarray(out), np.full((4, 3), 2.0))


def test_compile_one_shot_matches_the_default_compilation():
    def f(x):
        return jnp.tanh(x @ x.T).sum(0) + jnp.sqrt(jnp.abs(x)).mean()

    x = jnp.asarray(np.random.default_rng(0).normal(size=(16, 8)), jnp.float32)
    one_shot = compile_one_shot(jax.jit(f), x)
    reference = np.asarray(jax.jit(f)(x), np.float64)
    np.testing.assert_allclose(np.asarray(one_shot(x)), reference, rtol=1e-6, atol=1e-6)


def test_overlapped_runs_tasks_in_order_and_waits_for_them():
    order = []
    with overlapped() as background:
        first = background.submit(order.append, "first")
        second = background.submit(order.append, "second")
    assert first.done() and second.done() and order == ["first", "second"]


def test_overlapped_cancels_pending_tasks_when_the_block_fails():
    started, release = threading.Event(), threading.Event()
    ran = []

    def blocking():
        started.set()
        release.wait()
        ran.append("blocking")

    with pytest.raises(RuntimeError, match="boom"), overlapped() as background:
        running = background.submit(blocking)
        pending = background.submit(ran.append, "pending")
        started.wait()
        release.set()
        raise RuntimeError("boom")
    assert running.done() and pending.cancelled() and ran == ["blocking"]  # pyright: ignore[reportPossiblyUnboundVariable]  # the block ran


def test_overlapped_task_errors_surface_at_result_and_at_the_end():
    with pytest.raises(ZeroDivisionError), overlapped() as background:
        failing = background.submit(lambda: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            failing.result()
    with pytest.raises(ZeroDivisionError), overlapped() as background:
        background.submit(lambda: 1 / 0)  # nobody asks for its result: raised at the end


def test_tally_counts_only_the_measuring_threads_compilations(tmp_path):
    tally = CompileTally()
    x = jnp.ones(5)
    # a new persistent cache: compiled, never loaded, whatever cache the run has (the TPU lane's)
    with persistent_cache(tmp_path / "cache"), tally.measure():
        other = threading.Thread(target=lambda: jax.jit(lambda v: v - 7)(x).block_until_ready())
        other.start()
        other.join()
        jax.jit(lambda v: v * 11)(x).block_until_ready()
    assert (tally.compiled, tally.loaded, tally.total) == (1, 0, 1)


def test_initial_state_program_equals_the_eager_initialisation():
    cfg = SpiralConfig(epochs=1, out=None, progress=False, cache=False)
    from jaxwise.cli._jobs._common import make_optimizer

    tx, _ = make_optimizer(10, cfg.lr, cfg.weight_decay, cfg.warmup, cfg.end_lr)
    build = jax.jit(lambda: initial_state(tx, (2, 8, 3), 4))
    state = compile_one_shot(build)()
    init_key, state_key = jax.random.split(jax.random.key(4))
    expected = init_mlp(init_key, (2, 8, 3))
    for got, want in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected), strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    assert jax.random.key_data(state.key).tolist() == jax.random.key_data(state_key).tolist()
    assert all(not jax.typeof(leaf).weak_type for leaf in jax.tree.leaves(state))


@pytest.mark.parametrize("dp", [False, True])
def test_spiral_job_compiles_three_programs_and_the_epoch_once(dp):
    cfg = SpiralConfig(  # own widths per case: nothing found in the in-memory caches
        epochs=2,
        n_per_class=40,
        batch_size=32,
        hidden=(17,) if dp else (16,),
        out=None,
        progress=False,
        cache=False,
        dp=dp,
    )
    with CompileCounter() as counter:
        summary = run_spiral(cfg)
    names = sorted(r.fun_name for r in counter.records)
    epochs = [name for name in names if name.endswith("_train_epoch)")]
    expected = ["jit(_verification)", "jit(initial_state)"]
    if dp:  # DP epochs report no loss: the training set is evaluated after each
        expected.append("jit(evaluate)")
    assert len(epochs) == 1 and sorted(set(names) - set(epochs)) == sorted(expected), names
    assert summary["compiles"] == 1 and summary["checks"]["compiles_once"]["ok"]
    assert summary["checks"]["state_donated"]["ok"] and summary["skipped"] == 0
    assert len(summary["hard_examples"]) == 5


def test_no_cache_turns_a_cache_configured_outside_off_for_the_block(tmp_path):
    """``persistent_cache(None)`` (``--no-cache``): nothing loaded, even from JAX's own cache."""
    x = jnp.ones(6)
    with persistent_cache(tmp_path / "outside"):  # as JAX_COMPILATION_CACHE_DIR would set it
        outside = jax.config.jax_compilation_cache_dir
        jax.jit(lambda v: v * 13)(x).block_until_ready()  # now in that cache
        tally = CompileTally()
        with persistent_cache(None) as used, tally.measure():
            assert used is None and jax.config.jax_compilation_cache_dir is None
            jax.jit(lambda v: v * 13)(x).block_until_ready()
        assert jax.config.jax_compilation_cache_dir == outside  # restored
    assert (tally.compiled, tally.loaded) == (1, 0)

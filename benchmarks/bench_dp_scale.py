"""DP gradients at accelerator scale: ghost, vmap and jax-privacy vs a non-private gradient.

Models (issue 42): a pre-LN transformer classifier (token embedding, vocabulary 8192, +
learned positions; L blocks of [LayerNorm -> multi-head self-attention with a (d, 3, H, d/H)
QKV projection and an (H, d/H, d) output projection, residual; LayerNorm -> GELU MLP
d -> 4d -> d without biases, residual]; final LayerNorm, mean-pool, d -> 10 head;
per-example cross-entropy) at (L4, d512, H8, T256, B32) and (L6, d768, H12, T256, B64),
and a GPT-2-small-shaped causal LM (12 layers, d 768, 12 heads, T 512, vocabulary 32768,
untied head, next-token loss averaged over each example's tokens) at the largest batch in
(32, 16, 8) whose non-private program fits the chip (compiled ``memory_analysis``).

For each: the non-private gradient (``jax.grad`` of the batch mean), ``dp_gradient`` with
``method="auto"`` (the default: what `per_example.clip_plan` chooses on the backend, named in
the note; the same compiled program as the explicit method it resolves to), ``"ghost"``,
``"vmap"`` (all per-example gradients at once, when ``B·P`` floats fit) and ``"chunked"`` with
micro-batches of 8 (per-example gradients kept, clipped and summed in a ``lax.scan``), and
jax-privacy 2.0's ``clipped_grad`` (plain ``vmap`` when it fits, and micro-batches of 8,
``nan_safe=False``; Gaussian noise added the same way), each compiled ONCE
(``jit(...).lower(...).compile()``), the median of N calls after a warm-up call (results
blocked); FLOPs from each compiled program's cost analysis, peak
memory as its ``memory_analysis`` temp + argument + output bytes, MFU against the TPU v5e's
197e12 bf16 FLOP/s (n/a elsewhere). Float32 parameters, the backend's default matmul
precision. A program whose memory does not fit the device is not run.

``--whole-step``: the whole private step instead, at the 49M classifier (quick size on CPU):
``train.make_epoch`` of ``dp_gradient_fn(...)`` with AdamW under ``PoissonSampler(B)``
(DP-SGD) and under ``CyclicPoissonSampler(B, groups=8)`` with ``noise=BandMF(bands=8)``,
against the non-private ``make_epoch(value_and_grad(...), ShuffleSampler(B))``; 8 steps an
epoch, the median epoch time of N epochs after a warm-up one, per step; table
``dp_whole_step.md``.

``python3 benchmarks/bench_dp_scale.py``: full size on an accelerator, a tiny quick size on
CPU (or with ``--quick``); the table goes to ``benchmarks/results/<backend>/dp_scale.md``
and to ``$OUT/dp_scale.md`` when ``OUT`` is set, and is printed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib import version as jaxlib_version

from jaxwise import optim, privacy, train
from jaxwise.per_example import clip_plan
from jaxwise.per_example._api import Method
from jaxwise.privacy import dp_gradient

PEAK_FLOPS = {"TPU v5 lite": 197e12, "TPU v5e": 197e12}
AUTO, MICRO, MICRO4 = "DP auto", "DP micro-batched (chunked, 8)", "DP micro-batched (chunked, 4)"
MICRO16 = "DP micro-batched (chunked, 16)"
RESULTS = Path(__file__).resolve().parent / "results"


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    layers: int
    d: int
    heads: int
    t: int
    vocab: int
    causal_lm: bool
    batches: tuple[int, ...]  # the batch, or candidates largest-first (the first that fits)


FULL = [
    Config("classifier L4 d512 H8 T256", 4, 512, 8, 256, 8192, False, (32,)),
    Config("classifier L6 d768 H12 T256", 6, 768, 12, 256, 8192, False, (64,)),
    Config("GPT-2-small LM L12 d768 H12 T512 V32768", 12, 768, 12, 512, 32768, True, (32, 16, 8)),
]
QUICK = [
    Config("classifier L1 d16 H2 T8", 1, 16, 2, 8, 32, False, (4,)),
    Config("causal LM L1 d16 H2 T8 V64", 1, 16, 2, 8, 64, True, (4, 2)),
]


# --------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------


def init(cfg: Config, key: jax.Array) -> dict[str, Any]:
    d, h = cfg.d, cfg.heads
    ks = iter(jax.random.split(key, 4 + 4 * cfg.layers))
    n = lambda shape, scale: scale * jax.random.normal(next(ks), shape, jnp.float32)  # noqa: E731
    blocks = []
    for _ in range(cfg.layers):
        blocks.append(
            {
                "ln1": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
                "qkv": n((d, 3, h, d // h), d**-0.5),
                "out": n((h, d // h, d), d**-0.5),
                "ln2": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
                "fc1": n((d, 4 * d), d**-0.5),
                "fc2": n((4 * d, d), (4 * d) ** -0.5),
            }
        )
    n_out = cfg.vocab if cfg.causal_lm else 10
    return {
        "embed": n((cfg.vocab, d), 0.02),
        "pos": n((cfg.t, d), 0.02),
        "blocks": blocks,
        "ln_f": {"scale": jnp.ones(d), "bias": jnp.zeros(d)},
        "head": n((d, n_out), d**-0.5),
        "head_bias": jnp.zeros(n_out),
    }


def _norm(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * p["scale"] + p["bias"]


def make_loss(cfg: Config) -> Callable[[Any, Any], jax.Array]:
    """``loss(params, (tokens (T,), target)) -> scalar`` for ONE example."""
    scale = np.float32(1 / np.sqrt(cfg.d // cfg.heads))

    def loss(p: Any, example: Any) -> jax.Array:
        tokens, target = example
        x = p["embed"][tokens] + p["pos"]
        for blk in p["blocks"]:
            h = _norm(x, blk["ln1"])
            q, k, v = jnp.einsum("td,dche->cthe", h, blk["qkv"])
            s = jnp.einsum("the,she->hts", q, k) * scale
            if cfg.causal_lm:
                causal = jnp.tril(jnp.ones((cfg.t, cfg.t), bool))
                s = jnp.where(causal, s, np.float32(-1e9))
            a = jax.nn.softmax(s, axis=-1)
            o = jnp.einsum("hts,she->the", a, v)
            x = x + jnp.einsum("the,hed->td", o, blk["out"])
            h = _norm(x, blk["ln2"])
            x = x + jax.nn.gelu(h @ blk["fc1"]) @ blk["fc2"]
        x = _norm(x, p["ln_f"])
        if cfg.causal_lm:
            logits = x @ p["head"] + p["head_bias"]  # (T, V)
            logp = jax.nn.log_softmax(logits, axis=-1)
            return -jnp.mean(jnp.take_along_axis(logp, target[:, None], axis=-1))
        logits = x.mean(0) @ p["head"] + p["head_bias"]
        return -jax.nn.log_softmax(logits)[target]

    return loss


def make_batch(cfg: Config, b: int, key: jax.Array) -> tuple[jax.Array, jax.Array]:
    k1, k2 = jax.random.split(key)
    tokens = jax.random.randint(k1, (b, cfg.t + 1 if cfg.causal_lm else cfg.t), 0, cfg.vocab)
    if cfg.causal_lm:
        return tokens[:, :-1], tokens[:, 1:]
    return tokens, jax.random.randint(k2, (b,), 0, 10)


# --------------------------------------------------------------------------
# The programs
# --------------------------------------------------------------------------


def programs(cfg: Config, b: int) -> dict[str, Callable[..., Any]]:
    loss = make_loss(cfg)

    def nonprivate(params: Any, batch: Any, key: jax.Array) -> Any:
        del key
        return jax.grad(lambda p: jnp.mean(jax.vmap(loss, in_axes=(None, 0))(p, batch)))(params)

    def dp(method: Method, chunk: int | None = None) -> Callable[..., Any]:
        def fn(params: Any, batch: Any, key: jax.Array) -> Any:
            out = dp_gradient(
                loss,
                params,
                batch,
                key,
                clip_norm=1.0,
                noise_multiplier=1.0,
                method=method,
                chunk_size=chunk,
            )
            return out.grads, out.norms

        return fn

    out = {
        "non-private": nonprivate,
        AUTO: dp("auto"),
        "DP ghost": dp("ghost"),
        "DP vmap": dp("vmap"),
        MICRO: dp("chunked", 8),
        MICRO4: dp("chunked", 4),
        MICRO16: dp("chunked", 16),
    }
    try:
        from jax_privacy import clipped_grad
    except ImportError:
        return out

    def peer(microbatch: int | None) -> Callable[..., Any]:
        grad_fn = clipped_grad(
            loss,
            l2_clip_norm=1.0,
            batch_argnums=1,
            keep_batch_dim=False,
            microbatch_size=microbatch,
            nan_safe=False,
        )

        def fn(params: Any, batch: Any, key: jax.Array) -> Any:
            summed = grad_fn(params, batch)
            leaves, treedef = jax.tree.flatten(summed)
            keys = jax.random.split(key, len(leaves))
            noisy = [(g + jax.random.normal(k, g.shape, g.dtype)) / b for g, k in zip(leaves, keys)]
            return jax.tree.unflatten(treedef, noisy)

        return fn

    out["jax-privacy clipped_grad"] = peer(None)
    out["jax-privacy clipped_grad (micro 8)"] = peer(8)
    out["jax-privacy clipped_grad (micro 4)"] = peer(4)
    return out


def _cost(compiled: Any) -> dict[str, float]:
    cost = compiled.cost_analysis()
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}
    return dict(cost or {})


def _memory(compiled: Any) -> int | None:
    mem = compiled.memory_analysis()
    if mem is None:
        return None
    return int(mem.temp_size_in_bytes + mem.argument_size_in_bytes + mem.output_size_in_bytes)


def _capacity() -> int | None:
    if jax.default_backend() == "cpu":
        return None
    try:
        stats = jax.devices()[0].memory_stats() or {}
    except Exception:
        stats = {}
    return int(stats.get("bytes_limit", 15.7 * 2**30))


@dataclasses.dataclass
class Row:
    config: str
    batch: int
    method: str
    seconds: float | None = None
    flops: float | None = None
    bytes_accessed: float | None = None
    memory: int | None = None
    note: str = ""


def _median(fn: Callable[[], Any], n: int) -> float:
    jax.block_until_ready(fn())  # warm-up (compiled already)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def run_config(
    cfg: Config,
    n: int,
    capacity: int | None,
    log: Callable[[str], None],
    methods: set[str] | None = None,
) -> list[Row]:
    key = jax.random.key(0)
    params = init(cfg, key)
    rows: list[Row] = []
    b, progs, np_compiled = cfg.batches[-1], {}, None
    for cand in cfg.batches:  # the largest batch whose non-private program fits
        b = cand
        progs = programs(cfg, b)
        batch = make_batch(cfg, b, jax.random.key(1))
        np_compiled = jax.jit(progs["non-private"]).lower(params, batch, key).compile()
        mem = _memory(np_compiled)
        log(f"{cfg.name} B={b}: non-private memory {mem}")
        if capacity is None or mem is None or mem <= capacity:
            break
    batch = make_batch(cfg, b, jax.random.key(1))
    n_params = sum(x.size for x in jax.tree.leaves(params))
    # jax-privacy without micro-batching (and our vmap) forms all B per-example gradients at
    # once: when they take half the device, the program (with its activations) does not fit
    # and its compile is wasted (costly): not compiled; the peer runs micro-batched instead.
    plain_fits = capacity is None or 4 * b * n_params < 0.5 * capacity
    peer, micro = "jax-privacy clipped_grad", "jax-privacy clipped_grad (micro 8)"
    peer_micro = (micro, "jax-privacy clipped_grad (micro 4)")
    wanted = [name for name in progs if name == "non-private" or methods is None or name in methods]
    first = [name for name in wanted if name not in (peer_micro if plain_fits else (peer,))]
    too_big = [] if plain_fits else [name for name in ("DP vmap", peer) if name in wanted]
    first = [name for name in first if name not in too_big]
    twin, plan_line = _auto_twin(cfg, params, batch) if AUTO in first else (None, "")
    twin = twin if twin in first else None
    if twin:  # auto resolves to an explicit program: compiled once, timed in both rows
        first.remove(AUTO)
        first.insert(first.index(twin) + 1, AUTO)
    own = [name for name in first if name != "non-private" and not (name == AUTO and twin)]
    compiled = _compile_all({name: progs[name] for name in own}, (params, batch, key))
    compiled["non-private"] = np_compiled
    if twin:
        compiled[AUTO] = compiled[twin]
    notes = {AUTO: plan_line}
    for name in too_big:
        rows.append(Row(cfg.name, b, name, note="B per-example gradients take half the device"))
    for name in first:
        row = _measure(Row(cfg.name, b, name), compiled[name], (params, batch, key), n, capacity)
        row.note = row.note or notes.get(name, "")
        log(f"  {name}: {row}")
        rows.append(row)
        if name == peer and row.seconds is None and micro in wanted:  # plain peer failed
            compiled.update(_compile_all({micro: progs[micro]}, (params, batch, key)))
            first.append(micro)
    return rows


def _auto_twin(cfg: Config, params: Any, batch: Any) -> tuple[str | None, str]:
    """The explicit program ``method="auto"`` resolves to here (if one), and its plan in a line."""
    plan = clip_plan(make_loss(cfg), params, batch)
    twin = {"ghost": "DP ghost", "vmap": "DP vmap"}.get(plan.method)
    if plan.method == "chunked":
        twin = {8: MICRO, 4: MICRO4, 16: MICRO16}.get(plan.chunk_size or 0)
    line = f"auto = {plan.method}" + (f" (micro {plan.chunk_size})" if plan.chunk_size else "")
    return twin, f"{line}: {plan.reason}"


def _compile_all(fns: dict[str, Callable[..., Any]], args: tuple[Any, ...]) -> dict[str, Any]:
    """Each program lowered here, then compiled concurrently (XLA compiles off the GIL):
    the compiled program, or the exception its compile raised."""
    lowered: dict[str, Any] = {}
    for name, fn in fns.items():
        try:
            lowered[name] = jax.jit(fn).lower(*args)
        except Exception as err:
            lowered[name] = err

    def compile_one(item: Any) -> Any:
        if isinstance(item, Exception):
            return item
        try:
            return item.compile()
        except Exception as err:
            return err

    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        return dict(zip(lowered, pool.map(compile_one, lowered.values())))


def _measure(row: Row, compiled: Any, args: tuple[Any, ...], n: int, capacity: int | None) -> Row:
    if isinstance(compiled, Exception):
        first_line = (str(compiled).splitlines() or [""])[0][:120]
        row.note = f"does not compile: {type(compiled).__name__}: {first_line}"
        return row
    cost = _cost(compiled)
    row.flops, row.bytes_accessed = cost.get("flops"), cost.get("bytes accessed")
    row.memory = _memory(compiled)
    if capacity is not None and row.memory is not None and row.memory > capacity:
        row.note = f"does not fit ({row.memory / 2**30:.1f} GiB)"
        return row
    try:
        row.seconds = _median(lambda: compiled(*args), n)
    except Exception as err:
        row.note = f"failed: {type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]}"
    return row


# --------------------------------------------------------------------------
# The whole private step
# --------------------------------------------------------------------------

WHOLE_STEPS = 8


def whole_step_epochs(cfg: Config, b: int) -> dict[str, tuple[Any, Any]]:
    """``{name: (epoch, state)}``: non-private, DP-SGD and BandMF(8) epochs of 8 steps, AdamW."""
    loss = make_loss(cfg)
    params = init(cfg, jax.random.key(0))

    def batch_loss(p: Any, batch: Any) -> jax.Array:
        return jnp.mean(jax.vmap(loss, in_axes=(None, 0))(p, batch))

    cyclic = privacy.CyclicPoissonSampler(b, groups=8)
    band = privacy.BandMF(bands=8, steps=cyclic.steps(WHOLE_STEPS * b))
    gradients = {
        "non-private": (train.value_and_grad(batch_loss), train.ShuffleSampler(b)),
        "DP-SGD": (
            privacy.dp_gradient_fn(loss, clip_norm=1.0, noise_multiplier=1.0),
            privacy.PoissonSampler(b),
        ),
        "BandMF(8)": (
            privacy.dp_gradient_fn(loss, clip_norm=1.0, noise_multiplier=1.0, noise=band),
            cyclic,
        ),
    }
    out = {}
    for name, (gradient, sampler) in gradients.items():
        epoch = train.make_epoch(gradient, sampler)
        state = train.TrainState.create(params, optim.adamw(1e-4), 0, gradient=gradient)
        out[name] = (epoch, state)
    return out


def run_whole_step(cfg: Config, n: int, log: Callable[[str], None]) -> list[Row]:
    b = cfg.batches[0]
    data = make_batch(cfg, WHOLE_STEPS * b, jax.random.key(1))
    rows = []
    for name, (epoch, state) in whole_step_epochs(cfg, b).items():
        t0 = time.perf_counter()
        state, _ = epoch(state, data)  # compile + warm-up
        jax.block_until_ready(state)
        log(f"  {name}: first epoch {time.perf_counter() - t0:.1f} s")
        samples = []
        for _ in range(n):
            t0 = time.perf_counter()
            state, metrics = epoch(state, data)
            jax.block_until_ready((state, metrics))
            samples.append((time.perf_counter() - t0) / len(np.asarray(metrics["skipped"])))
        rows.append(Row(cfg.name, b, name, seconds=statistics.median(samples)))
        log(f"  {name}: {rows[-1]}")
    return rows


# --------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------


def _fmt_time(s: float | None) -> str:
    if s is None:
        return "—"
    return f"{s * 1e3:.2f} ms" if s < 1 else f"{s:.2f} s"


def _ratio(x: float | None, ref: float | None) -> str:
    if x is None or not ref:
        return "—"
    return f"{x / ref:.2f}×"


def render(rows: list[Row], peak: float | None, header: str) -> str:
    cols = [
        "model",
        "B",
        "method",
        "time",
        "/ non-private",
        "FLOPs / non-private",
        "bytes accessed / non-private",
        "peak memory",
        "memory / non-private",
        "MFU",
        "note",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    ref: dict[str, Row] = {r.config: r for r in rows if r.method == "non-private"}
    for r in rows:
        base = ref.get(r.config)
        mfu = f"{r.flops / r.seconds / peak:.2f}" if peak and r.flops and r.seconds else "n/a"
        mem = "—" if r.memory is None else f"{r.memory / 2**20:.1f} MiB"
        cells = [
            r.config,
            r.batch,
            r.method,
            _fmt_time(r.seconds),
            _ratio(r.seconds, base.seconds if base else None),
            _ratio(r.flops, base.flops if base else None),
            _ratio(r.bytes_accessed, base.bytes_accessed if base else None),
            mem,
            _ratio(r.memory, base.memory if base else None),
            mfu,
            r.note,
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return f"{header}\n\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (automatic on CPU)")
    parser.add_argument("--n", type=int, default=None, help="timed calls per program")
    parser.add_argument("--configs", default=None, help="comma-separated model indices")
    parser.add_argument("--methods", default=None, help="comma-separated method names")
    parser.add_argument(
        "--whole-step", action="store_true", help="time whole DP epochs (DP-SGD, BandMF(8))"
    )
    args = parser.parse_args(argv)
    if args.whole_step:
        return main_whole_step(args)
    backend = jax.default_backend()
    quick = args.quick or backend == "cpu"
    n = args.n or (2 if quick else 5)
    kind = jax.devices()[0].device_kind
    peak = PEAK_FLOPS.get(kind) if backend == "tpu" else None
    capacity = _capacity()
    start = time.perf_counter()
    rows: list[Row] = []
    configs = QUICK if quick else FULL
    if args.configs:
        configs = [configs[int(i)] for i in args.configs.split(",")]
    # names hold commas ("DP micro-batched (chunked, 8)"): split at commas outside parentheses
    methods = None if args.methods is None else set(re.split(r",(?![^()]*\))", args.methods))
    for cfg in configs:
        rows += run_config(
            cfg, n, capacity, lambda s: print(s, file=sys.stderr, flush=True), methods
        )

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = (
        "## DP gradients at scale: auto, ghost clipping, per-example, micro-batched, "
        "jax-privacy vs non-private\n\n"
        f"_backend {backend}, device {kind}, jax {jax.__version__}, "
        f"jaxlib {jaxlib_version.__version__}, "
        f"Python {platform.python_version()}, {datetime.date.today().isoformat()}, "
        f"{'quick sizes' if quick else 'full sizes'}, median of {n} calls after warm-up, "
        f"float32 parameters at the default matmul precision, load {load:.2f}, "
        f"total {time.perf_counter() - start:.0f} s_\n\n"
        "DP = `dp_gradient(..., clip_norm=1, noise_multiplier=1, method=...)` (auto: its "
        "`clip_plan` in the note); jax-privacy = "
        "`clipped_grad(..., keep_batch_dim=False, nan_safe=False)` + the same Gaussian noise "
        "(micro-batched only when the plain program does not fit). Memory = compiled "
        "`memory_analysis` temp + argument + output. MFU = the program's own XLA FLOPs / time "
        f"/ {peak or 0:.3g} FLOP/s. XLA's cost analysis counts a loop body once: the "
        "micro-batched programs' (ours and the peer's) FLOPs and bytes are those of one "
        "micro-batch."
    )
    text = render(rows, peak, header)
    if os.environ.get("OUT"):  # first: a device's checkout may be read-only
        Path(os.environ["OUT"], "dp_scale.md").write_text(text)
    dest = RESULTS / backend
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "dp_scale.md").write_text(text)
    print(text)
    return text


def main_whole_step(args: argparse.Namespace) -> str:
    backend = jax.default_backend()
    quick = args.quick or backend == "cpu"
    n = args.n or (2 if quick else 5)
    cfg = QUICK[0] if quick else FULL[1]
    start = time.perf_counter()
    rows = run_whole_step(cfg, n, lambda s: print(s, file=sys.stderr, flush=True))
    base = rows[0].seconds
    lines = [
        "| model | B | step | time per step | / non-private |",
        "|---|---|---|---|---|",
        *(
            f"| {r.config} | {r.batch} | {r.method} | {_fmt_time(r.seconds)} | "
            f"{_ratio(r.seconds, base)} |"
            for r in rows
        ),
    ]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    header = (
        "## The whole private step: DP-SGD and BandMF(8) epochs vs non-private\n\n"
        f"_backend {backend}, device {jax.devices()[0].device_kind}, jax {jax.__version__}, "
        f"{'quick sizes' if quick else 'full sizes'}, {WHOLE_STEPS} steps an epoch, median of "
        f"{n} epochs after a warm-up one, per step; AdamW, float32 parameters at the default "
        f"matmul precision, load {load:.2f}, total {time.perf_counter() - start:.0f} s_\n\n"
        "`train.make_epoch(privacy.dp_gradient_fn(loss, clip_norm=1, noise_multiplier=1), "
        'privacy.PoissonSampler(B))` (DP-SGD; `method="auto"`), the same with '
        "`noise=BandMF(bands=8)` under `CyclicPoissonSampler(B, groups=8)`, vs "
        "`make_epoch(value_and_grad(batch-mean loss), ShuffleSampler(B))`. Poisson epochs "
        "draw a random number of examples a step (expected B)."
    )
    text = f"{header}\n\n" + "\n".join(lines) + "\n"
    if os.environ.get("OUT"):  # first: a device's checkout may be read-only
        Path(os.environ["OUT"], "dp_whole_step.md").write_text(text)
    dest = RESULTS / backend
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "dp_whole_step.md").write_text(text)
    print(text)
    return text


if __name__ == "__main__":
    main()

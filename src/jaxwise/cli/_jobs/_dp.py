"""The DP options of the training jobs: ``--mechanism``, ``--bands``, ``--adaptive-clip``.

`check_dp_options` refuses bad combinations before any work (JAX-free); `dp_plan` turns the
options into the library's objects: the noise mechanism (``None``, ``BandMF``, ``BLT``), the
sampler it is accounted with (``PoissonSampler``, or ``CyclicPoissonSampler`` whose groups
separate an example's participations as the mechanism needs), the clip norm (a float or an
``AdaptiveClip``) and the noise multiplier. ``--mechanism auto`` (and ``bandmf`` without
``--bands``) keep the ε that ``--noise-multiplier`` gives DP-SGD and take the mechanism with
the lowest expected error at that ε (`privacy.choose_mechanism`); an explicit mechanism runs
at ``--noise-multiplier`` as given.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from jaxwise._shared._checks import UserError
from jaxwise.cli._options import option_float, option_int

__all__ = [
    "BLT_BUFFERS",
    "DELTA",
    "MECHANISMS",
    "DPPlan",
    "check_dp_options",
    "dp_gradient",
    "dp_plan",
    "dp_summary",
]

DELTA = 1e-5
MECHANISMS = ("dpsgd", "bandmf", "blt", "auto")
BLT_BUFFERS = 2  # the BLT of --mechanism blt: memory 2·|params|, whatever the steps


class DPPlan(NamedTuple):
    """What a DP run trains with and reports.

    Attributes:
        mechanism: ``"dpsgd"``, ``"bandmf"`` or ``"blt"`` (``auto`` resolved).
        noise: ``None``, the ``BandMF`` or the ``BLT``.
        sampler: the ``PoissonSampler`` or ``CyclicPoissonSampler``.
        clip: the clip norm, or the ``AdaptiveClip``.
        noise_multiplier: σ of the gradient's noise.
        bands: BandMF's bands (1 for DP-SGD, ``None`` for BLT).
        buffers: BLT's buffers (``None`` otherwise).
        expected_error_vs_dpsgd: the RMSE of the noise in the model over DP-SGD's at the same
            ε (below 1: better than DP-SGD).
        steps: the steps the mechanism is built for (every epoch).
    """

    mechanism: str
    noise: Any
    sampler: Any
    clip: Any
    noise_multiplier: float
    bands: int | None
    buffers: int | None
    expected_error_vs_dpsgd: float
    steps: int


def check_dp_options(cfg: Any) -> None:
    """``--mechanism``/``--bands``/``--adaptive-clip``: only with ``--dp``, values in range.

    Raises:
        UserError: the option, what it needs and what was given.
    """
    given = [
        name
        for name, value in (
            ("--mechanism", cfg.mechanism),
            ("--bands", cfg.bands),
            ("--adaptive-clip", cfg.adaptive_clip),
        )
        if value is not None
    ]
    if given and not cfg.dp:
        verb = "needs" if len(given) == 1 else "need"
        raise UserError(f"{', '.join(given)} {verb} --dp (options of DP training)")
    if cfg.mechanism is not None and cfg.mechanism not in MECHANISMS:
        raise UserError(f"--mechanism must be one of {', '.join(MECHANISMS)}, got {cfg.mechanism}")
    if cfg.bands is not None:
        option_int(cfg.bands, "--bands", min_value=1)
        if cfg.mechanism != "bandmf":
            raise UserError(
                f"--bands sets BandMF's bands: it needs --mechanism bandmf, got "
                f"--mechanism {cfg.mechanism or 'dpsgd'}"
            )
    if cfg.adaptive_clip is not None:
        option_float(
            cfg.adaptive_clip,
            "--adaptive-clip",
            min_value=0.0,
            max_value=1.0,
            min_inclusive=False,
            max_inclusive=False,
        )
    if cfg.dp and cfg.mechanism not in (None, "dpsgd") and not cfg.noise_multiplier:
        raise UserError(
            f"--mechanism {cfg.mechanism} correlates noise: it needs --noise-multiplier > 0"
        )


def _clip(cfg: Any, batch_size: int) -> Any:
    from jaxwise.privacy import AdaptiveClip

    if cfg.adaptive_clip is None:
        return float(cfg.clip_norm)
    # Andrew et al. 2021: the count's noise about a twentieth of the expected batch
    return AdaptiveClip(
        float(cfg.clip_norm),
        target_quantile=float(cfg.adaptive_clip),
        count_noise=max(1.0, batch_size / 20.0),
    )


def _relative(noise: Any, sigma: float, q: float, rate: float, steps: int) -> float:
    """σ·RMSE of ``noise`` over DP-SGD's at the ε this run's gradient noise gives."""
    from jaxwise import privacy

    if noise is None:
        return 1.0
    eps = privacy.epsilon(
        noise_multiplier=sigma, sample_rate=rate, steps=steps, delta=DELTA, mechanism=noise
    )
    sigma_dpsgd = privacy.noise_multiplier_for(epsilon=eps, sample_rate=q, steps=steps, delta=DELTA)
    dpsgd = privacy.bandmf_strategy(steps, 1).rmse
    return float(sigma * noise.strategy.rmse / (sigma_dpsgd * dpsgd))


def _chosen(cfg: Any, n: int, steps: int) -> Any:
    """The `choose_mechanism` candidate at the ε ``--noise-multiplier`` gives DP-SGD."""
    from jaxwise import privacy

    q = cfg.batch_size / n
    target = privacy.epsilon(
        noise_multiplier=cfg.noise_multiplier, sample_rate=q, steps=steps, delta=DELTA
    )
    buffers = (BLT_BUFFERS,) if cfg.mechanism == "auto" else ()
    choice = privacy.choose_mechanism(
        steps, epsilon=target, delta=DELTA, n=n, batch_size=cfg.batch_size, blt_buffers=buffers
    )
    return choice.best


def _dpsgd(batch: int, clip: Any, sigma: float, steps: int) -> DPPlan:
    from jaxwise.privacy import PoissonSampler

    return DPPlan("dpsgd", None, PoissonSampler(batch), clip, sigma, 1, None, 1.0, steps)


@functools.lru_cache(maxsize=8)
def dp_plan(cfg: Any, n: int) -> DPPlan:
    """The mechanism, sampler, clip and σ of a ``--dp`` run over ``n`` training examples.

    Raises:
        UserError: ``--bands`` above the run's steps, or more than the data's groups hold.
    """
    from jaxwise import privacy

    batch = int(cfg.batch_size)
    steps = cfg.epochs * privacy.PoissonSampler(batch).steps(n)
    q, sigma, clip = batch / n, float(cfg.noise_multiplier), _clip(cfg, batch)
    name = cfg.mechanism or "dpsgd"
    if name == "dpsgd":
        return _dpsgd(batch, clip, sigma, steps)
    if name == "auto" or (name == "bandmf" and cfg.bands is None):
        best = _chosen(cfg, n, steps)
        noise, sigma, relative = best.mechanism, best.noise_multiplier, best.relative
        if name == "bandmf" and noise is None:
            noise = privacy.BandMF(bands=1, steps=steps)  # DP-SGD bit for bit: nothing better
        sampler = privacy.CyclicPoissonSampler(batch, groups=best.groups)
    elif name == "bandmf":
        bands = int(cfg.bands)
        if bands > steps:
            raise UserError(f"--bands {bands} exceeds the run's {steps} steps")
        if bands * batch > n:
            raise UserError(
                f"--bands {bands} with --batch-size {batch} needs {bands * batch} training "
                f"examples (every group holds a batch), got {n}"
            )
        noise = privacy.BandMF(bands=bands, steps=steps)
        sampler = privacy.CyclicPoissonSampler(batch, groups=bands)
        relative = _relative(noise, sigma, q, sampler.sample_rate(n), steps)
    else:  # blt: one batch a group, every example once an epoch
        groups = max(1, n // batch)
        noise = privacy.BLT(buffers=BLT_BUFFERS, steps=steps, min_sep=groups)
        sampler = privacy.CyclicPoissonSampler(batch, groups=groups)
        relative = _relative(noise, sigma, q, sampler.sample_rate(n), steps)
    if noise is None:  # auto chose DP-SGD: the given σ (the calibrated one is within 1e-4)
        return _dpsgd(batch, clip, float(cfg.noise_multiplier), steps)
    if isinstance(noise, privacy.BLT):
        return DPPlan("blt", noise, sampler, clip, sigma, None, noise.buffers, relative, steps)
    return DPPlan("bandmf", noise, sampler, clip, sigma, noise.bands, None, relative, steps)


@functools.lru_cache(maxsize=8)
def dp_gradient(cfg: Any, n: int, loss: Any) -> Any:
    """THE run's `privacy.dp_gradient_fn` (ghost clipping) for `dp_plan`'s mechanism and clip.

    Built once per run (cached): the `TrainState` is created from it
    (``TrainState.create(..., gradient=...)``: its noise buffers, its adaptive clip norm) and
    the epoch runs it; nothing else builds one.
    """
    from jaxwise import privacy

    plan = dp_plan(cfg, n)
    return privacy.dp_gradient_fn(
        loss,
        clip_norm=plan.clip,
        noise_multiplier=plan.noise_multiplier,
        method="ghost",
        noise=plan.noise,
    )


def dp_summary(cfg: Any, n: int, steps: int) -> dict[str, Any]:
    """The ``dp`` keys of a run's JSON: ε over ``steps`` steps, mechanism, bands, σ, sampling."""
    from jaxwise import privacy

    plan = dp_plan(cfg, n)
    rate = plan.sampler.sample_rate(n)
    clip = plan.clip if cfg.adaptive_clip is not None else None
    eps = (
        privacy.epsilon(
            noise_multiplier=plan.noise_multiplier,
            sample_rate=rate,
            steps=steps,
            delta=DELTA,
            mechanism=plan.noise,
            clip=clip,
        )
        if plan.noise_multiplier and steps
        else float("inf")
    )
    summary: dict[str, Any] = {
        "epsilon": eps,
        "delta": DELTA,
        "mechanism": plan.mechanism,
        "mechanism_option": cfg.mechanism or "dpsgd",
        "bands": plan.bands,
        "expected_error_vs_dpsgd": plan.expected_error_vs_dpsgd,
        "noise_multiplier": plan.noise_multiplier,
        "clip_norm": cfg.clip_norm,
        "sample_rate": rate,
        "steps": steps,
        "sampling": "poisson" if plan.mechanism == "dpsgd" else "cyclic_poisson",
    }
    if plan.mechanism != "dpsgd":
        summary["groups"] = plan.sampler.groups
    if plan.buffers is not None:
        summary["buffers"] = plan.buffers
    if cfg.adaptive_clip is not None:
        summary["adaptive_clip"] = {"target_quantile": cfg.adaptive_clip}
    return summary

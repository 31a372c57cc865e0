"""A whole epoch as one ``lax.scan`` program: the only scanned training loop of jaxwise.

An epoch is a *sampler* (how the epoch's mini-batches are drawn, inside the program) plus the one
update path of `jaxwise.train._update` with a *gradient function*. Plain training uses
`ShuffleSampler` and ``value_and_grad`` of the loss; DP-SGD
(`make_dp_train_epoch`) plugs in Poisson sampling and the DP
gradient, and so gets the NaN guard, the donation audit and ``mesh`` of every other program.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh
from jax.typing import DTypeLike

from jaxwise._checks import check_int
from jaxwise._placement import data_size as _data_size
from jaxwise.train._convolution import canonical_convolutions
from jaxwise.train._precision import DynamicLossScale
from jaxwise.train._state import TrainState, check_train_state
from jaxwise.train._step import (
    Program,
    check_flags,
    leading_size,
    program_name,
    update_config,
    validate,
)
from jaxwise.train._update import GradientFn, Gradients, UpdateConfig, loss_gradient, make_update

if TYPE_CHECKING:  # a type only: train does not import per_example at run time
    from jaxwise.per_example import LossFn

__all__ = [
    "Sampler",
    "ShuffleSampler",
    "TrainEpoch",
    "make_train_epoch",
    "sampler_widths",
    "shuffle_hash",
]


class Sampler(Protocol):
    """How an epoch draws its mini-batches from ``n`` examples, inside the compiled program.

    ``plan(key, step, n) -> (xs, key)`` runs once per epoch with the state's key and step
    counter; it returns the scanned-over ``xs`` (leading axis: steps) and the state's next key
    (a sampler that draws from ``jax.random`` splits it; one that does not returns it as it is).
    ``draw(x, n)`` runs in every step and returns ``(indices (width,), mask (width,) or
    None, metrics)``; padding indices (masked out) are ``n``: they gather zeros.
    ``steps(n)`` and ``width(n)`` are Python ints; ``check(n)`` raises
    ``ValueError`` for a dataset the sampler cannot use.

    A sampler with a mask may also offer ``widths(n)``: ascending padded widths, the last
    one ``width(n)``. Each step then runs its gradient at the smallest width that holds its
    real examples (their indices come first), one branch of a ``lax.switch`` per width, so
    padding costs at most the gap to the next width instead of ``width(n) - count``.
    """

    def check(self, n: int) -> None:
        """Refuse a dataset the sampler cannot draw from.

        Args:
            n: the number of examples.

        Raises:
            ValueError: the sampler cannot draw batches from ``n`` examples.
        """
        ...

    def steps(self, n: int) -> int:
        """The number of steps of an epoch.

        Args:
            n: the number of examples.

        Returns:
            The steps per epoch.
        """
        ...

    def width(self, n: int) -> int:
        """The (static) number of rows of every batch.

        Args:
            n: the number of examples.

        Returns:
            The batch width (padded rows included).
        """
        ...

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[Any, jax.Array]:
        """The epoch's plan, traced once per epoch.

        Args:
            key: the state's key.
            step: the state's step counter.
            n: the number of examples.

        Returns:
            ``(xs, next_key)``: what the scan iterates over (leading axis: steps) and the
            state's key for after the epoch.
        """
        ...

    def draw(self, x: Any, n: int) -> tuple[jax.Array, jax.Array | None, dict[str, Any]]:
        """One step's batch, traced inside the scan.

        Args:
            x: this step's slice of the plan's ``xs``.
            n: the number of examples.

        Returns:
            ``(indices, mask, metrics)``: int ``(width,)`` rows to gather, bool ``(width,)``
            real rows (``None`` when all are real), and extra per-step metrics.
        """
        ...


@dataclasses.dataclass(frozen=True)
class ShuffleSampler:
    """One random permutation per epoch cut into ``n // batch_size`` batches (remainder dropped).

    The permutation sorts the examples by a keyed integer hash of their index: ``h(i) =
    mix(mix(i + s) ^ k1)`` with ``mix`` the bijective "lowbias32" mixer (Wellons, 2018) and the
    seed ``s`` mixed from the state's key data and step counter. ``h`` is a bijection of the
    32-bit integers, so there are no ties and the result is a permutation; the key is not
    consumed (each epoch starts at another step, so each gets another order). It is a shuffle for
    SGD, not a cryptographic one: it compiles to one elementwise fusion and one sort, where
    ``jax.random.bits`` would add a Threefry loop to every epoch program (about a tenth of the
    spiral epoch's compile time). Privacy-critical sampling (DP-SGD) uses ``jax.random``.

    Attributes:
        batch_size: rows per batch, >= 1.

    Raises:
        TypeError: ``batch_size`` is not an int.
        ValueError: ``batch_size < 1``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> xs, key = ShuffleSampler(4).plan(jax.random.key(0), jnp.int32(0), 10)
        >>> xs.shape
        (2, 4)
    """

    batch_size: int

    def __post_init__(self) -> None:
        check_int(self.batch_size, "batch_size", min_value=1)

    def check(self, n: int) -> None:
        """Refuse a dataset smaller than one batch.

        Args:
            n: the number of examples.

        Raises:
            ValueError: ``batch_size > n``.
        """
        if self.batch_size > n:
            raise ValueError(
                f"`batch_size` {self.batch_size} is larger than the dataset ({n} examples)"
            )

    def steps(self, n: int) -> int:
        """``n // batch_size``: the remainder is dropped.

        Args:
            n: the number of examples.

        Returns:
            The steps per epoch.
        """
        return n // self.batch_size

    def width(self, n: int) -> int:
        """``batch_size``: no padding.

        Args:
            n: the number of examples (unused).

        Returns:
            The batch width.
        """
        del n
        return self.batch_size

    def plan(self, key: jax.Array, step: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
        """The epoch's permutation, cut into batches.

        Args:
            key: the state's key (not consumed).
            step: the state's step counter.
            n: the number of examples.

        Returns:
            ``(indices, key)``: int32 ``(steps, batch_size)`` rows of each step, and ``key``
            unchanged.
        """
        steps = self.steps(n)
        order = jnp.argsort(shuffle_hash(key, step, n))
        return order[: steps * self.batch_size].reshape(steps, self.batch_size), key

    def draw(self, x: jax.Array, n: int) -> tuple[jax.Array, None, dict[str, Any]]:
        """One step's rows: the plan's row, every one real.

        Args:
            x: the step's indices ``(batch_size,)``.
            n: the number of examples (unused).

        Returns:
            ``(x, None, {})``.
        """
        del n
        return x, None, {}


def _mix(x: jax.Array) -> jax.Array:
    """The "lowbias32" integer mixer: a bijection of uint32 with strong avalanche."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def shuffle_hash(key: jax.Array, step: jax.Array, n: int) -> jax.Array:
    """Distinct keyed 32-bit hashes of ``0..n-1`` (uint32 ``(n,)``); ``argsort`` is a shuffle.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> h = shuffle_hash(jax.random.key(0), jnp.int32(3), 1000)
        >>> len(set(h.tolist()))
        1000
    """
    data = jax.random.key_data(key).reshape(-1).astype(jnp.uint32)
    seed = _mix(data[0] ^ _mix(data[-1] ^ _mix(jnp.asarray(step).astype(jnp.uint32))))
    index = jnp.arange(n, dtype=jnp.uint32)
    return _mix(_mix(index + seed) ^ data[-1])


class TrainEpoch(Program):
    """``epoch(state, data) -> (state, metrics)``: a whole epoch as one ``lax.scan`` program.

    Made by [`make_train_epoch`][jaxwise.train.make_train_epoch] (or
    [`make_dp_train_epoch`][jaxwise.privacy.make_dp_train_epoch]), which validate the
    arguments; call it like a function.

    Args:
        name: the program's name.
        gradient: how a batch becomes a gradient.
        optimizer: the optimizer.
        sampler: how the epoch draws its batches.
        config: the validated static configuration of the update.
        donate: donate the state.
        mesh: the mesh, or ``None``.
        audit: check donation on every call.
        loss_fn: the user's loss, named in the error when its first trace fails.

    Attributes:
        sampler: how the epoch draws its batches.
        config: the settings of a plugged-in scheme (e.g.
            [`DPConfig`][jaxwise.privacy.DPConfig]), or None.
    """

    config: Any = None

    def __init__(
        self,
        name: str,
        gradient: GradientFn,
        optimizer: optax.GradientTransformation,
        sampler: Sampler,
        config: UpdateConfig,
        *,
        donate: bool,
        mesh: Mesh | None,
        audit: bool,
        loss_fn: Any = None,
    ) -> None:
        self.sampler = sampler
        self.batch_size = getattr(sampler, "batch_size", None)
        update = make_update(gradient, optimizer, config)
        unsharded = dataclasses.replace(config, batch_sharding=None)  # constrained per branch
        update_at_width = make_update(
            _at_width(gradient, config.batch_sharding), optimizer, unsharded
        )

        def epoch(state: TrainState, data: Any) -> tuple[TrainState, dict[str, Any]]:
            n = jax.tree.leaves(data)[0].shape[0]
            xs, key = sampler.plan(state.key, state.step, n)
            widths = sampler_widths(sampler, n)

            def body(carry: TrainState, x: Any) -> tuple[TrainState, dict[str, Any]]:
                idx, mask, drawn = sampler.draw(x, n)
                if len(widths) > 1 and mask is not None:
                    count = jnp.sum(mask.astype(jnp.int32))
                    # the smallest width that holds the real examples
                    which = jnp.searchsorted(jnp.asarray(widths, jnp.int32), count)
                    carry, metrics = update_at_width(carry, (data, idx, which, widths), mask)
                    drawn = {**drawn, "width": jnp.asarray(widths, jnp.int32)[which]}
                else:
                    batch = _gather(data, idx)
                    carry, metrics = update(carry, batch, mask)
                return carry, {**metrics, **drawn}

            return jax.lax.scan(body, state.replace(key=key), xs)

        super().__init__(
            canonical_convolutions(epoch),  # XLA:CPU: fast convolutions inside the scan
            name=name,
            optimizer=optimizer,
            donate=donate,
            mesh=mesh,
            audit=audit,
            loss_scale=config.loss_scale,
            loss_fn=loss_fn,
        )

    def steps_per_epoch(self, n: int) -> int:
        """How many steps an epoch over ``n`` examples runs.

        Args:
            n: the number of examples.

        Returns:
            The sampler's steps per epoch.
        """
        return self.sampler.steps(n)

    def sample_rate(self, n: int) -> float:
        """The (expected) fraction of the ``n`` examples in one batch, for privacy accounting.

        Args:
            n: the number of examples.

        Returns:
            ``batch_size / n`` (the expected batch size for Poisson sampling).
        """
        return getattr(self.sampler, "batch_size", self.sampler.width(n)) / n

    def __call__(self, state: TrainState, data: Any) -> tuple[TrainState, dict[str, Any]]:
        check_train_state(state)
        n = leading_size(data, "data")
        self.sampler.check(n)
        if self.mesh is not None:
            width = self.sampler.width(n)
            if width % _data_size(self.mesh):
                raise ValueError(
                    f"the batch size {width} is not divisible by the {_data_size(self.mesh)} "
                    "devices of "
                    "the mesh's 'data' axis"
                )
            state, data = self._place(state, data, self.replicated)
        return self._run(state, data)


def sampler_widths(sampler: Sampler, n: int) -> tuple[int, ...]:
    """The padded widths a sampler's steps may run at (its ``widths(n)``, else ``width(n)``)."""
    widths: Any = getattr(sampler, "widths", None)
    if not callable(widths):
        return (sampler.width(n),)
    planned: Any = widths(n)
    return tuple(int(w) for w in planned)


def _gather(data: Any, idx: jax.Array) -> Any:
    # padding indices (>= n, masked out) read zeros, never a real row
    return jax.tree.map(lambda a: jnp.take(a, idx, axis=0, mode="fill", fill_value=0), data)


def _at_width(gradient: GradientFn, sharding: Any) -> GradientFn:
    """``gradient`` at the padded width a step needs: one ``lax.switch`` branch per width.

    Its batch is ``(data, indices, which, widths)``: branch ``which`` gathers the first
    ``widths[which]`` rows (the real examples come first) and runs ``gradient`` on them, so
    only the chosen width's work is done; every branch is compiled once, inside the one
    epoch program.
    """

    def gradient_at_width(
        params: Any, model_state: Any, lazy: Any, key: Any, mask: Any, scale: Any
    ) -> Gradients:
        data, idx, which, widths = lazy

        def at(width: int) -> Any:
            def run(params: Any, model_state: Any, data: Any, idx: Any, key: Any, mask: Any):
                batch = _gather(data, idx[:width])
                if sharding is not None:
                    batch = jax.lax.with_sharding_constraint(batch, sharding)
                return gradient(params, model_state, batch, key, mask[:width], scale)

            return run

        branches = [at(w) for w in widths]
        return jax.lax.switch(which, branches, params, model_state, data, idx, key, mask)

    return gradient_at_width


def _custom_gradient(gradient: Any) -> GradientFn:
    """Adapt a plugged-in ``gradient(params, model_state, batch, key, mask) -> Gradients``."""

    def adapted(
        params: Any, model_state: Any, batch: Any, key: Any, mask: Any, scale: Any
    ) -> Gradients:
        del scale
        out = gradient(params, model_state, batch, key, mask)
        if not isinstance(out, Gradients):
            raise TypeError(
                f"`gradient` must return a jaxwise.train.Gradients, got {type(out).__name__}"
            )
        return out

    return adapted


def make_train_epoch(
    loss_fn: LossFn | Callable[..., Any],
    optimizer: optax.GradientTransformation,
    batch_size: int | np.integer,
    *,
    model_state: bool = False,
    has_aux: bool = False,
    donate: bool = True,
    skip_nonfinite: bool = True,
    mesh: Mesh | None = None,
    compute_dtype: DTypeLike | None = None,
    loss_scale: float | Literal["dynamic"] | DynamicLossScale | None = None,
    with_key: bool = False,
    audit: bool = True,
    gradient: Callable[..., Gradients] | None = None,
    sampler: Sampler | None = None,
) -> TrainEpoch:
    """A whole epoch as one jitted program: ``epoch(state, data) -> (state, per-step metrics)``.

    ``data`` is a pytree of arrays sharing the leading (example) dimension,
    e.g. ``(X, Y)``; it is an argument (never captured, never donated). Inside
    the program: the state's key is split, the examples are permuted,
    ``n // batch_size`` fixed-shape mini-batches (of ``data``'s structure)
    are taken — the remainder is dropped, a different remainder each epoch —
    and the steps run in one ``lax.scan``. Metrics are stacked per step.
    Everything else (``model_state``, ``has_aux``, the NaN guard, donation
    audits, ``mesh``, ``compute_dtype``/``loss_scale``) is as in
    [`make_train_step`][jaxwise.train.make_train_step]; with ``mesh`` the data is replicated
    and each mini-batch sharded over the ``"data"`` axis.

    Two plug-ins make other training schemes configurations of this one loop
    (DP-SGD: [`make_dp_train_epoch`][jaxwise.privacy.make_dp_train_epoch]):

    - ``sampler``: how batches are drawn (a [`Sampler`][jaxwise.train.Sampler]; default
      ``ShuffleSampler(batch_size)``), e.g. Poisson sampling with a mask.
    - ``gradient``: replaces ``value_and_grad(loss_fn)``;
      ``gradient(params, model_state, batch, key, mask) -> Gradients`` with a
      fresh ``key`` every step and the sampler's ``mask``. ``loss_fn`` then
      only names the program.

    Args:
        loss_fn: the loss, as for [`make_train_step`][jaxwise.train.make_train_step]:
            ``loss_fn(params, batch) -> loss`` on one mini-batch.
        optimizer: the optimizer the state was created with.
        batch_size: rows per mini-batch, >= 1 (with the default sampler).
        model_state: thread ``state.model_state`` through the loss.
        has_aux: the loss returns ``(loss, aux)``; ``metrics["aux"]`` stacks them.
        donate: donate the state.
        skip_nonfinite: skip (and count in ``metrics["skipped"]``) non-finite steps.
        mesh: a mesh with a ``"data"`` axis: each mini-batch is sharded over it.
        compute_dtype: ``jnp.bfloat16`` or ``jnp.float16`` for the forward/backward pass.
        loss_scale: ``"dynamic"``, a ``DynamicLossScale`` or a fixed scale.
        with_key: pass a fresh key to the loss every step.
        audit: check donation on every call.
        gradient: a plugged-in gradient function (see above), or ``None``.
        sampler: a plugged-in [`Sampler`][jaxwise.train.Sampler], or ``None`` for
            ``ShuffleSampler(batch_size)``.

    Returns:
        A [`TrainEpoch`][jaxwise.train.TrainEpoch]: ``epoch(state, data) -> (state,
        metrics)`` with every metric stacked over the steps (leading axis).

    Raises:
        TypeError: as for ``make_train_step``, or ``gradient`` is not callable.
        ValueError: as for ``make_train_step``, ``batch_size`` is not divisible by the mesh's
            ``"data"`` axis, or ``compute_dtype``/``loss_scale`` given with a ``gradient``.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), 0)
        >>> epoch = make_train_epoch(loss, optim.sgd(0.1), batch_size=4)
        >>> state, metrics = epoch(state, (jnp.ones((10, 3)), jnp.ones(10)))
        >>> int(state.step), metrics["loss"].shape
        (2, (2,))
    """
    validate(loss_fn, optimizer, mesh)
    batch_size = check_int(batch_size, "batch_size", min_value=1)
    check_flags(
        model_state=model_state,
        has_aux=has_aux,
        donate=donate,
        skip_nonfinite=skip_nonfinite,
        with_key=with_key,
        audit=audit,
    )
    if mesh is not None and sampler is None and batch_size % _data_size(mesh):
        raise ValueError(
            f"`batch_size` {batch_size} is not divisible by the {_data_size(mesh)} devices of the "
            "mesh's 'data' axis"
        )
    config, dtype = update_config(
        skip_nonfinite=skip_nonfinite,
        has_aux=has_aux,
        with_key=with_key,
        mesh=mesh,
        compute_dtype=compute_dtype,
        loss_scale=loss_scale,
    )
    if gradient is None:
        grad_fn = loss_gradient(
            loss_fn,
            model_state=bool(model_state),
            has_aux=config.has_aux,
            with_key=config.needs_key,
            compute_dtype=dtype,
        )
    else:
        if not callable(gradient):
            raise TypeError(f"`gradient` must be callable, got {type(gradient).__name__}")
        if dtype is not None or config.loss_scale is not None:
            raise ValueError(
                "`compute_dtype` and `loss_scale` apply to the default gradient only, not to a "
                "plugged-in `gradient`"
            )
        grad_fn = _custom_gradient(gradient)
        config = dataclasses.replace(config, needs_key=True)
    if sampler is None:
        sampler = ShuffleSampler(batch_size)
    return TrainEpoch(
        program_name(loss_fn, "train_epoch"),
        grad_fn,
        optimizer,
        sampler,
        config,
        donate=bool(donate),
        mesh=mesh,
        audit=bool(audit),
        loss_fn=loss_fn,
    )

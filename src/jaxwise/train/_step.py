"""Donation-safe, NaN-guarded training steps: the jitted program wrapper shared with epochs."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh
from jax.typing import DTypeLike

from jaxwise._checks import check_bool, check_callable
from jaxwise._params import check_alive, check_params, describe_leaves
from jaxwise._placement import data_size as _data_size
from jaxwise._placement import feeding_processes, keep_layout, place_for_mesh
from jaxwise._prefetch import place_batch
from jaxwise.sharding import batch_sharding as _batch_sharding
from jaxwise.sharding import replicated
from jaxwise.train._donation import Audit, check_optimizer_fits
from jaxwise.train._precision import DynamicLossScale, check_compute_dtype, check_loss_scale
from jaxwise.train._state import TrainState, check_train_state
from jaxwise.train._update import UpdateConfig, loss_gradient, make_update
from jaxwise.tree import path_names

if TYPE_CHECKING:  # types only: train does not import per_example at run time
    import numpy as np

    from jaxwise.per_example import LossFn


def leading_size(data: Any, what: str) -> int:
    """The leading (example) dimension shared by every leaf of ``data``; else ``ValueError``."""
    names, leaves = path_names(data), jax.tree.leaves(data)
    if not leaves:
        raise ValueError(f"`{what}` has no arrays")
    check_alive(data, what)
    sizes = {}
    for name, leaf in zip(names, leaves):
        shape = jnp.shape(leaf)
        if len(shape) == 0:
            raise ValueError(
                f"`{what}` leaf `{name or '<root>'}` is a scalar; every leaf needs a leading "
                "example axis"
            )
        sizes[name or "<root>"] = shape[0]
    if len(set(sizes.values())) != 1:
        listing = ", ".join(f"`{k}`: {v}" for k, v in sizes.items())
        raise ValueError(
            f"`{what}` arrays must share their leading (example) dimension, got {listing}"
        )
    return next(iter(sizes.values()))


def validate(loss_fn: Any, optimizer: Any, mesh: Any) -> None:
    """Checks shared by every program factory (before any tracing)."""
    check_callable(loss_fn, "loss_fn")
    if not (
        callable(getattr(optimizer, "init", None)) and callable(getattr(optimizer, "update", None))
    ):
        raise TypeError(
            f"`optimizer` must have `init` and `update` (an optax.GradientTransformation), got "
            f"{optimizer!r}"
        )
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        if "data" not in mesh.axis_names:
            raise ValueError(
                f"`mesh` needs an axis named 'data' to shard the batch over, got {mesh.axis_names}"
            )


def check_flags(**flags: Any) -> None:
    """Every flag a bool (``TypeError`` naming it: ``donate="no"`` would be truthy)."""
    for name, value in flags.items():
        check_bool(value, name)


def update_config(
    *,
    skip_nonfinite: bool,
    has_aux: bool,
    with_key: bool,
    mesh: Mesh | None,
    compute_dtype: Any,
    loss_scale: Any,
) -> tuple[UpdateConfig, np.dtype | None]:
    """The validated static configuration of an update, and the compute dtype."""
    dtype = check_compute_dtype(compute_dtype)
    scale = check_loss_scale(loss_scale, dtype)
    config = UpdateConfig(
        skip_nonfinite=bool(skip_nonfinite),
        needs_key=bool(with_key),
        has_aux=bool(has_aux),
        loss_scale=scale,
        batch_sharding=_batch_sharding(mesh) if mesh is not None else None,
    )
    return config, dtype


def program_name(loss_fn: Any, suffix: str) -> str:
    """``<user's function name>_<suffix>``: the program's name (``jit(loss_train_step)``)."""
    fn = loss_fn
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    name = getattr(fn, "__name__", None) or type(fn).__name__
    name = re.sub(r"\W+", "_", name).strip("_") or "loss"
    return f"{name}_{suffix}"


class Program:
    """A jitted ``fn(state, data) -> (state, metrics)`` with per-call audits and mesh placement.

    Args:
        fn: the program, ``fn(state, data) -> (state, metrics)``.
        name: the program's name (``jit(<name>)``).
        optimizer: the optimizer the state must fit (checked on the first call).
        donate: donate the state to the program.
        mesh: place state and data on this mesh, or ``None``.
        audit: check donation on every call.
        loss_scale: the update's loss scaling (a ``DynamicLossScale`` keeps its state in
            ``state.loss_scale``).

    Attributes:
        jitted: the underlying ``jax.jit`` function (for ``.lower``, ``stage_report``,
            ``CompileCounter(step)``…); it compiles under the name ``<loss name>_<kind>``.
        mesh: the mesh, or ``None``.
        batch_sharding: how each mini-batch is sharded over the mesh (``None`` without one).
    """

    data_name = "data"

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        optimizer: optax.GradientTransformation,
        donate: bool,
        mesh: Mesh | None,
        audit: bool,
        loss_scale: DynamicLossScale | float | None,
        loss_fn: Any = None,
    ) -> None:
        fn = keep_layout(fn, mesh)  # FSDP (a "model" axis): the state keeps its layout
        fn.__name__ = fn.__qualname__ = name
        self.mesh = mesh
        self.optimizer = optimizer
        self.replicated = replicated(mesh) if mesh is not None else None
        self.batch_sharding = _batch_sharding(mesh) if mesh is not None else None
        self.jitted = jax.jit(fn, donate_argnames=("state",)) if donate else jax.jit(fn)
        self._audit = Audit(donate=donate and audit, data_name=self.data_name)
        self._checks = audit
        self._first = True
        self._dynamic = loss_scale if isinstance(loss_scale, DynamicLossScale) else None
        self._loss_code = _code_of(loss_fn)

    def _place(self, state: TrainState, data: Any, data_sharding: Any) -> tuple[TrainState, Any]:
        if self.mesh is None:
            return state, data
        fsdp = "model" in self.mesh.axis_names
        if fsdp or getattr(state.step, "sharding", None) != self.replicated:
            state = place_for_mesh(state, self.mesh)  # replicated, or the FSDP layout
        return state, place_batch(data, data_sharding)

    def _run(self, state: TrainState, data: Any) -> tuple[TrainState, dict[str, Any]]:
        if self._dynamic is not None and state.loss_scale is None:
            state = state.replace(
                loss_scale=self._dynamic.init()
            )  # the scale lives in the state from now on
        leaves = self._audit.before(state, data)
        check_alive(data, self.data_name)
        if self._first:
            check_params(state.params, "state.params")  # e.g. complex params put in by replace
            check_optimizer_fits(self.optimizer, state.params, state.opt_state)
            try:
                result = (
                    self._audit.first_call(self.jitted, state, data)
                    if self._checks
                    else self.jitted(state, data)
                )
            except (TypeError, ValueError) as err:
                named = self._named(err, state, data)
                if named is err:
                    raise
                raise named from err
            self._first = False
        else:
            result = self.jitted(state, data)
        self._audit.after(state, leaves, result)
        return result

    def _named(self, err: Exception, state: TrainState, data: Any) -> Exception:
        """An error raised inside the user's loss while tracing, with the shapes it was given."""
        if self._loss_code is None or not _raised_in(err, self._loss_code):
            return err
        sizes = {jnp.shape(x)[0] for x in jax.tree.leaves(data) if jnp.ndim(x)}
        leading = " (their leading dimensions differ)" if len(sizes) > 1 else ""
        message = (
            f"the loss function failed on its first call with "
            f"{describe_leaves(state.params, 'params')} and "
            f"{describe_leaves(data, self.data_name)}{leading}: {err}"
        )
        try:
            return type(err)(message)
        except Exception:  # an exception type that takes other arguments: keep it as it is
            return err


def _code_of(fn: Any) -> Any:
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    code = getattr(fn, "__code__", None)
    if code is None and callable(fn):  # an object with a __call__ method
        code = getattr(type(fn).__call__, "__code__", None)
    return code


def _raised_in(err: BaseException, code: Any) -> bool:
    """Whether a frame of ``code`` is in ``err``'s traceback."""
    tb = err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is code:
            return True
        tb = tb.tb_next
    return False


class TrainStep(Program):
    """``step(state, batch) -> (state, metrics)``: one jitted, donating, NaN-guarded update.

    Made by [`make_train_step`][jaxwise.train.make_train_step], which validates the arguments
    and documents the behaviour; call it like a function.

    Args:
        loss_fn: the loss, as for ``make_train_step``.
        optimizer: the optimizer.
        config: the validated static configuration of the update.
        model_state: thread ``state.model_state`` through the loss.
        compute_dtype: the forward/backward dtype, or ``None``.
        donate: donate the state.
        mesh: the mesh, or ``None``.
        audit: check donation on every call.
    """

    data_name = "batch"

    def __init__(
        self,
        loss_fn: LossFn | Callable[..., Any],
        optimizer: optax.GradientTransformation,
        config: UpdateConfig,
        *,
        model_state: bool,
        compute_dtype: DTypeLike | None,
        donate: bool,
        mesh: Mesh | None,
        audit: bool,
    ) -> None:
        gradient = loss_gradient(
            loss_fn,
            model_state=model_state,
            has_aux=config.has_aux,
            with_key=config.needs_key,
            compute_dtype=compute_dtype,
        )
        update = make_update(gradient, optimizer, config)

        def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
            return update(state, batch, None)

        super().__init__(
            step,
            name=program_name(loss_fn, "train_step"),
            optimizer=optimizer,
            donate=donate,
            mesh=mesh,
            audit=audit,
            loss_scale=config.loss_scale,
            loss_fn=loss_fn,
        )

    def __call__(self, state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
        check_train_state(state)
        if self.mesh is not None:
            n = leading_size(batch, "batch") * feeding_processes(batch, self.mesh)
            if n % _data_size(self.mesh):
                raise ValueError(
                    f"the global batch size {n} is not divisible by the {_data_size(self.mesh)} "
                    "devices of the "
                    "mesh's 'data' axis"
                )
            state, batch = self._place(state, batch, self.batch_sharding)
        return self._run(state, batch)


def make_train_step(
    loss_fn: LossFn | Callable[..., Any],
    optimizer: optax.GradientTransformation,
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
) -> TrainStep:
    """A jitted training step ``step(state, batch) -> (state, metrics)``.

    Every call audits donation: a deleted state leaf (a state used after it
    was donated), a batch leaf that is a state leaf, or a donated leaf still
    alive after the call (a live NumPy view) raises
    [`DonationError`][jaxwise.train.DonationError] naming the path. The first call also
    checks shared buffers, that the step keeps the state's type signature, and that
    ``optimizer`` fits ``state.opt_state`` (``ValueError`` before anything is donated).

    Args:
        loss_fn: ``loss_fn(params, batch) -> loss`` (a float scalar; the
            [`LossFn`][jaxwise.per_example.LossFn] protocol), or
            ``loss_fn(params, model_state, batch) -> (loss, new_model_state)`` with
            ``model_state=True``. With ``has_aux`` the loss is ``(loss, aux)``
            (``(loss, (new_model_state, aux))`` with model state) and ``aux`` is
            returned in ``metrics["aux"]``. With ``with_key=True`` a trailing
            ``key`` argument gets a fresh key split from ``state.key`` every step.
        optimizer: the optimizer the state was created with (Optax or
            jaxwise); checked against ``state.opt_state`` on the first call.
        model_state: thread ``state.model_state`` (BatchNorm statistics…)
            through the loss.
        has_aux: see ``loss_fn``.
        donate: donate the state (its buffers are reused for the new one).
        skip_nonfinite: a step whose loss, gradient or update is not finite
            returns the input state unchanged (bit-identical) with ``skipped = 1``.
        mesh: a ``jax.sharding.Mesh`` with a ``"data"`` axis: the batch is
            sharded over it, the state replicated (data parallelism).
        compute_dtype: ``jnp.bfloat16`` or ``jnp.float16``: params and floating
            batch leaves are cast for the forward/backward pass; the master weights,
            the optimizer state and the model state (BatchNorm statistics) keep their
            dtype (float32).
        loss_scale: ``"dynamic"`` (required with float16), a
            [`DynamicLossScale`][jaxwise.train.DynamicLossScale], or a fixed positive
            scale. Dynamic scaling keeps its scale in ``state.loss_scale`` and reports it in
            ``metrics["loss_scale"]``; an overflow skips the step.
        with_key: see ``loss_fn``.
        audit: check donation on every call (see above).

    Returns:
        A [`TrainStep`][jaxwise.train.TrainStep]; ``metrics`` has ``"loss"``,
        ``"grad_norm"`` and ``"skipped"`` (and ``"aux"``, ``"loss_scale"`` when used).

    Raises:
        TypeError: ``loss_fn`` is not callable, ``optimizer`` is not a transformation,
            ``mesh`` is not a mesh, a flag is not a bool, or ``compute_dtype`` is not
            bfloat16/float16/float32.
        ValueError: ``mesh`` has no ``"data"`` axis, an unknown ``loss_scale``, or float16
            without loss scaling.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> tx = optim.sgd(0.1)
        >>> state = TrainState.create({"w": jnp.zeros(3)}, tx, jax.random.key(0))
        >>> step = make_train_step(loss, tx)
        >>> state, metrics = step(state, (jnp.ones((4, 3)), jnp.ones(4)))
        >>> int(state.step), int(metrics["skipped"]), step.jitted.__name__
        (1, 0, 'lambda_train_step')
    """
    validate(loss_fn, optimizer, mesh)
    check_flags(
        model_state=model_state,
        has_aux=has_aux,
        donate=donate,
        skip_nonfinite=skip_nonfinite,
        with_key=with_key,
        audit=audit,
    )
    config, dtype = update_config(
        skip_nonfinite=skip_nonfinite,
        has_aux=has_aux,
        with_key=with_key,
        mesh=mesh,
        compute_dtype=compute_dtype,
        loss_scale=loss_scale,
    )
    return TrainStep(
        loss_fn,
        optimizer,
        config,
        model_state=bool(model_state),
        compute_dtype=dtype,
        donate=bool(donate),
        mesh=mesh,
        audit=bool(audit),
    )

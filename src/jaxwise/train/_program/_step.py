"""Donation-safe, NaN-guarded training steps: the jitted program wrapper shared with epochs."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

from jaxwise._shared._blame import from_user_loss
from jaxwise._shared._checks import check_bool, check_callable
from jaxwise._shared._params import check_alive, check_params, describe_leaves
from jaxwise._shared._prefetch import place_batch
from jaxwise.sharding import batch_sharding as _batch_sharding
from jaxwise.sharding import replicated
from jaxwise.train._program._donation import Audit, DonationError, check_optimizer_fits
from jaxwise.train._program._gradient import (
    GradientFn,
    StepContext,
    check_gradient_fn,
    gradient_loss,
    value_and_grad,
)
from jaxwise.train._program._placement import data_size as _data_size
from jaxwise.train._program._placement import feeding_processes, keep_layout, place_for_mesh
from jaxwise.train._program._state import TrainState, check_optimizer, check_train_state
from jaxwise.train._program._update import UpdatePlan, make_update, plan_update
from jaxwise.tree import path_names

if TYPE_CHECKING:  # types only: train does not import per_example at run time
    from jaxwise.per_example import LossFn

__all__ = ["JitProgram", "TrainStep", "make_step", "make_train_step"]


def leading_size(data: Any, what: str) -> int:
    """The leading (example) dimension shared by every leaf of ``data``; else ``ValueError``.

    Runs before every epoch call: the leaves' paths are read only to name a leaf at fault.
    """
    leaves = jax.tree.leaves(data)
    if not leaves:
        raise ValueError(f"`{what}` has no arrays")
    check_alive(data, what)
    leading = {jnp.shape(leaf)[:1] for leaf in leaves}  # () for a scalar leaf
    if len(leading) == 1 and (size := next(iter(leading))):
        return size[0]
    names = path_names(data)
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


def check_mesh(mesh: Any) -> None:
    """``None`` or a mesh with a ``"data"`` axis (checked before any tracing)."""
    if mesh is not None:
        if not isinstance(mesh, Mesh):
            raise TypeError(f"`mesh` must be a jax.sharding.Mesh, got {type(mesh).__name__}")
        if "data" not in mesh.axis_names:
            raise ValueError(
                f"`mesh` needs an axis named 'data' to shard the batch over, got {mesh.axis_names}"
            )


def check_gradient(gradient: Any) -> None:
    """``TypeError`` unless ``gradient`` is a `GradientFn` (callable, with ``init``)."""
    check_gradient_fn(gradient)


def check_flags(**flags: Any) -> None:
    """Every flag a bool (``TypeError`` naming it: ``donate="no"`` would be truthy)."""
    for name, value in flags.items():
        check_bool(value, name)


def program_name(loss: Any, suffix: str) -> str:
    """``<user's function name>_<suffix>``: the program's name (``jit(loss_train_step)``)."""
    fn = loss
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    name = getattr(fn, "__name__", None) or type(fn).__name__
    name = re.sub(r"\W+", "_", name).strip("_") or "loss"
    return f"{name}_{suffix}"


class JitProgram:
    """A jitted ``fn(state, data) -> (state, metrics)`` with per-call audits and mesh placement.

    Args:
        fn: the program, ``fn(state, data) -> (state, metrics)``.
        gradient: the gradient function the program runs.
        plan: how the update calls it.
        suffix: the program's name is ``<loss name>_<suffix>``.
        donate: donate the state to the program.
        mesh: place state and data on this mesh, or ``None``.
        audit: check donation on every call.

    Attributes:
        gradient: the gradient function.
        jitted: the underlying ``jax.jit`` function (for ``.lower``, ``stage_report``,
            ``CompileCounter(step)``…); it compiles under the name ``<loss name>_<kind>``.
        mesh: the mesh, or ``None``.
        batch_sharding: how each mini-batch is sharded over the mesh (``None`` without one).
    """

    data_name = "data"

    def __init__(
        self,
        fn: Callable[..., Any],
        gradient: GradientFn,
        plan: UpdatePlan,
        *,
        suffix: str,
        donate: bool,
        mesh: Mesh | None,
        audit: bool,
    ) -> None:
        fn = keep_layout(fn, mesh)  # FSDP (a "model" axis): the state keeps its layout
        loss = gradient_loss(gradient)
        fn.__name__ = fn.__qualname__ = program_name(loss, suffix)
        self.gradient = gradient
        self.mesh = mesh
        self.replicated = replicated(mesh) if mesh is not None else None
        self.batch_sharding = _batch_sharding(mesh) if mesh is not None else None
        self.jitted = jax.jit(fn, donate_argnames=("state",)) if donate else jax.jit(fn)
        self._audit = Audit(donate=donate and audit, data_name=self.data_name, function=fn.__name__)
        self._checks = audit
        self._first = True
        self._plan = plan

    def init_state(
        self, params: Any, tx: Any, key: jax.Array | int, *, model_state: Any = None
    ) -> TrainState:
        """A fresh state for this program: the gradient is the one it was made with.

        ``TrainState.create(params, tx, key, model_state=..., gradient=self.gradient)``: the
        gradient is handed over once (to ``make_step``/``make_epoch``) and its state (noise
        buffers, a clip norm, a loss scale) is made here, once.

        Args:
            params: the parameter pytree (copied).
            tx: the optimizer (jaxwise or Optax).
            key: typed key, raw ``PRNGKey`` or int seed.
            model_state: non-trainable state (BatchNorm statistics…), or ``None``.

        Returns:
            The state at step 0, as [`TrainState.create`][jaxwise.train.TrainState.create].

        Raises:
            TypeError, ValueError: as ``TrainState.create``.

        Examples:
            >>> import jax.numpy as jnp
            >>> from jaxwise import optim, train
            >>> step = train.make_step(train.value_and_grad(lambda p, b: jnp.sum((p - b) ** 2)))
            >>> int(step.init_state(jnp.zeros(3), optim.sgd(0.1), 0).step)
            0
        """
        return TrainState.create(params, tx, key, model_state=model_state, gradient=self.gradient)

    def _place(self, state: TrainState, data: Any, data_sharding: Any) -> tuple[TrainState, Any]:
        if self.mesh is None:
            return state, data
        fsdp = "model" in self.mesh.axis_names
        if fsdp or getattr(state.step, "sharding", None) != self.replicated:
            state = place_for_mesh(state, self.mesh)  # replicated, or the FSDP layout
        return state, place_batch(data, data_sharding)

    def _first_checks(self, state: TrainState) -> None:
        if state.tx is None:
            raise TypeError(
                "`state` has no optimizer (`state.tx` is None): create it with "
                "`TrainState.create(params, tx, key)`"
            )
        check_optimizer(state.tx, "state.tx")
        check_params(state.params, "state.params")  # e.g. complex params put in by replace
        check_optimizer_fits(state.tx, state.params, state.opt_state)
        self._check_gradient_state(state)

    def _check_gradient_state(self, state: TrainState) -> None:
        """``state.gradient_state`` has the structure and shapes of ``gradient.init(params)``.

        Run before the first call and again whenever a later call fails to trace (a state
        from another gradient function: a retrace), so it costs nothing per call.
        """
        want = jax.eval_shape(self.gradient.init, state.params)
        if state.gradient_state is None and jax.tree.leaves(want):
            raise ValueError(
                f"`state.gradient_state` is None but `{type(self.gradient).__name__}` keeps "
                "state (noise buffers, a clip norm, a loss scale): create the state with "
                "`program.init_state(params, tx, key)` (or "
                "`TrainState.create(params, tx, key, gradient=...)`, the same gradient)"
            )
        if state.gradient_state is not None:
            got = state.gradient_state
            same = jax.tree.structure(want) == jax.tree.structure(got) and all(
                jnp.shape(a) == jnp.shape(b)
                for a, b in zip(jax.tree.leaves(want), jax.tree.leaves(got))
            )
            if not same:
                raise ValueError(
                    "`state.gradient_state` does not have the structure and shapes of "
                    f"`{type(self.gradient).__name__}.init(params)`: "
                    f"{describe_leaves(got, 'gradient_state')} "
                    f"(structure {jax.tree.structure(got)}) vs "
                    f"{describe_leaves(want, 'init(params)')} "
                    f"(structure {jax.tree.structure(want)}); "
                    "create the state with `program.init_state(params, tx, key)` (or "
                    "`TrainState.create(params, tx, key, gradient=...)`, the same gradient)"
                )

    def _run(self, state: TrainState, data: Any) -> tuple[TrainState, dict[str, Any]]:
        leaves = self._audit.before(state, data)
        check_alive(data, self.data_name)
        if self._first:
            self._first_checks(state)
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
            try:
                result = self._audit.call(self.jitted, state, data)
            except DonationError:
                raise
            except (TypeError, ValueError, KeyError, IndexError):
                # a retrace that failed: a gradient_state of another gradient is named here
                self._check_gradient_state(state)
                raise
        self._audit.after(state, leaves, result)
        return result

    def _named(self, err: Exception, state: TrainState, data: Any) -> Exception:
        """An error raised inside the user's loss while tracing, with the shapes it was given.

        The gradient functions mark the errors that leave the user's loss where they call it
        (``jaxwise._shared._blame.user_loss``); jaxwise's own validation errors raised inside it
        (e.g.
        DP's refusal of BatchNorm statistics, marked ``own``) are already precise and pass
        unchanged, as do errors raised anywhere else.
        """
        if not from_user_loss(err):
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


class TrainStep(JitProgram):
    """``step(state, batch) -> (state, metrics)``: one jitted, donating, NaN-guarded update.

    Made by [`make_step`][jaxwise.train.make_step] (or
    [`make_train_step`][jaxwise.train.make_train_step]), which validate the arguments and
    document the behaviour; call it like a function.

    Args:
        gradient: the gradient function.
        donate: donate the state.
        mesh: the mesh, or ``None``.
        audit: check donation on every call.
    """

    data_name = "batch"

    def __init__(
        self,
        gradient: GradientFn,
        *,
        donate: bool,
        mesh: Mesh | None,
        audit: bool,
    ) -> None:
        plan = plan_update(gradient)
        update = make_update(gradient, plan)

        def step(state: TrainState, batch: Any) -> tuple[TrainState, dict[str, Any]]:
            rows = jax.tree.leaves(batch)[0].shape[0]
            # the caller's fixed-size batches: their rows are the (data-independent) divisor
            privacy = plan.requirements.privacy
            context = StepContext(
                expected_batch_size=float(rows), privacy=privacy, gradient=type(gradient).__name__
            )
            return update(state, batch, None, context)

        super().__init__(
            step, gradient, plan, suffix="train_step", donate=donate, mesh=mesh, audit=audit
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


def make_step(
    gradient: GradientFn,
    *,
    donate: bool = True,
    mesh: Mesh | None = None,
    audit: bool = True,
) -> TrainStep:
    """A jitted training step ``step(state, batch) -> (state, metrics)`` from a gradient function.

    The step computes ``gradient(params, model_state, batch, key=..., mask=None)`` and applies
    the state's own optimizer (``state.tx``). A step whose loss, gradient or update is not
    finite returns the input state unchanged (bit-identical) with ``metrics["skipped"] = 1``:
    the NaN guard is always on (it costs one scalar test). The gradient's state moves on even
    then; a private (DP) gradient's skipped step also counts: the step and the key move on.
    The gradient gets a `StepContext` whose ``expected_batch_size`` is the batch's rows (the
    caller's fixed-size batches).

    Every call audits donation: a deleted state leaf (a state used after it was donated), a
    batch leaf that is a state leaf, or a donated leaf still alive after the call (a live NumPy
    view) raises [`DonationError`][jaxwise.train.DonationError] naming the path. The first
    call also checks shared buffers, that the step keeps the state's type signature, that
    ``state.tx`` fits ``state.opt_state`` and that ``state.gradient_state`` has the structure
    of ``gradient.init(params)`` (``None`` only for a state without arrays).

    Args:
        gradient: a [`GradientFn`][jaxwise.train.GradientFn], e.g.
            [`value_and_grad`][jaxwise.train.value_and_grad]``(loss)``.
        donate: donate the state (its buffers are reused for the new one).
        mesh: a ``jax.sharding.Mesh`` with a ``"data"`` axis: the batch is sharded over it,
            the state replicated (data parallelism).
        audit: check donation on every call (see above).

    Returns:
        A [`TrainStep`][jaxwise.train.TrainStep]; ``metrics`` has ``"grad_norm"`` and
            ``"skipped"``, ``"loss"`` when the gradient computes one (and ``"aux"``,
            ``"loss_scale"`` and the gradient's own metrics when present).

    Raises:
        TypeError: ``gradient`` is not a `GradientFn`, ``mesh`` is not a mesh, or a flag is
            not a bool.
        ValueError: ``mesh`` has no ``"data"`` axis.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> from jaxwise.train import value_and_grad
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0))
        >>> step = make_step(value_and_grad(loss))
        >>> state, metrics = step(state, (jnp.ones((4, 3)), jnp.ones(4)))
        >>> int(state.step), int(metrics["skipped"]), step.jitted.__name__
        (1, 0, 'lambda_train_step')
    """
    check_gradient(gradient)
    check_flags(donate=donate, audit=audit)
    check_mesh(mesh)
    return TrainStep(gradient, donate=bool(donate), mesh=mesh, audit=bool(audit))


def make_train_step(
    loss: LossFn | Callable[..., Any],
    *,
    model_state: bool = False,
    has_aux: bool = False,
    with_key: bool = False,
    donate: bool = True,
    mesh: Mesh | None = None,
) -> TrainStep:
    """A jitted training step of a loss: ``make_step(value_and_grad(loss, ...), ...)``.

    Args:
        loss: ``loss(params, batch) -> loss`` (a float scalar; the
            [`LossFn`][jaxwise.per_example.LossFn] protocol), or
            ``loss(params, model_state, batch) -> (loss, new_model_state)`` with
            ``model_state=True``. With ``has_aux`` the loss is ``(loss, aux)``
            (``(loss, (new_model_state, aux))`` with model state) and ``aux`` is
            returned in ``metrics["aux"]``. With ``with_key=True`` a trailing
            ``key`` argument gets a fresh key split from ``state.key`` every step.
        model_state: thread ``state.model_state`` (BatchNorm statistics…) through the loss.
        has_aux: see ``loss``.
        with_key: see ``loss``.
        donate: donate the state (its buffers are reused for the new one).
        mesh: a mesh with a ``"data"`` axis (data parallelism), see
            [`make_step`][jaxwise.train.make_step].

    Returns:
        A [`TrainStep`][jaxwise.train.TrainStep] (see
            [`make_step`][jaxwise.train.make_step]); ``metrics`` has ``"loss"``,
            ``"grad_norm"`` and ``"skipped"`` (and ``"aux"`` with ``has_aux``).

    Raises:
        TypeError: ``loss`` is not callable, ``mesh`` is not a mesh or a flag is not a
            bool.
        ValueError: ``mesh`` has no ``"data"`` axis.

    Examples:
        >>> import jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> loss = lambda p, b: jnp.mean((b[0] @ p["w"] - b[1]) ** 2)
        >>> state = TrainState.create({"w": jnp.zeros(3)}, optim.sgd(0.1), jax.random.key(0))
        >>> step = make_train_step(loss)
        >>> state, metrics = step(state, (jnp.ones((4, 3)), jnp.ones(4)))
        >>> int(state.step), int(metrics["skipped"])
        (1, 0)
    """
    check_callable(loss, "loss")
    gradient = value_and_grad(loss, has_aux=has_aux, model_state=model_state, with_key=with_key)
    return make_step(gradient, donate=donate, mesh=mesh)

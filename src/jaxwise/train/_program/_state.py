"""``TrainState``: one small frozen dataclass whose type signature never changes."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxwise._shared._checks import is_key
from jaxwise._shared._params import check_alive, check_not_a_model, check_params
from jaxwise._typing import ModelState, PyTree
from jaxwise.train._program._gradient import check_gradient_fn
from jaxwise.tree import path_names


def _fresh(x: Any) -> Any:
    """An independent, strongly typed copy of an array leaf (never aliases the caller's buffer)."""
    if isinstance(x, jax.Array) and is_key(x):
        return jax.random.wrap_key_data(
            jnp.array(jax.random.key_data(x), copy=True), impl=jax.random.key_impl(x)
        )
    if isinstance(x, (jax.Array, np.ndarray, np.generic, float, int, bool, complex)):
        arr = jnp.asarray(x)
        return jnp.array(arr, dtype=arr.dtype, copy=True)  # dtype given: weak_type dropped
    return x


def _build(params: Any, model_state: Any, optimizer: Any) -> tuple[Any, Any, Any]:
    """Copies of ``params``, ``model_state`` and ``optimizer.init(params)``, built by ONE program.

    Building them eagerly would compile a small program per distinct leaf
    shape (dozens of compilations before training starts). ``jnp.copy``
    inside ``jit`` guarantees fresh output buffers (no aliasing of the
    caller's arrays, which donation would otherwise delete).
    """
    leaves = jax.tree.leaves((params, model_state))
    if not all(isinstance(leaf, (jax.Array, np.ndarray, np.generic)) for leaf in leaves):
        # Python scalars or typed keys among the leaves: keep the simple eager path
        params, model_state = jax.tree.map(_fresh, params), jax.tree.map(_fresh, model_state)
        return params, model_state, jax.tree.map(_fresh, optimizer.init(params))
    built = _build_jit(params, model_state, optimizer)
    return tuple(jax.tree.map(_strong, part) for part in built)  # type: ignore[return-value]


@functools.partial(jax.jit, static_argnums=2)
def _build_jit(params: Any, model_state: Any, optimizer: Any) -> tuple[Any, Any, Any]:
    # The optimizer (a NamedTuple of functions) is static: one compile per optimizer and shapes.
    params = jax.tree.map(jnp.copy, params)
    return params, jax.tree.map(jnp.copy, model_state), optimizer.init(params)


def _strong(x: Any) -> Any:
    """Drop weak types (a weakly typed leaf would change type after the first step)."""
    if isinstance(x, jax.Array) and not is_key(x) and jax.typeof(x).weak_type:
        return jnp.array(x, dtype=x.dtype, copy=True)
    return x


def check_optimizer(tx: Any, what: str) -> None:
    """``TypeError`` unless ``tx`` has ``init`` and ``update`` (a GradientTransformation)."""
    if not (callable(getattr(tx, "init", None)) and callable(getattr(tx, "update", None))):
        raise TypeError(
            f"`{what}` (the optimizer) must have `init` and `update` (an "
            "optax.GradientTransformation), "
            f"got {tx!r}"
        )


def init_gradient_state(gradient: Any, params: Any) -> Any:
    """``gradient.init(params)`` (fresh strong buffers); ``None`` when it has no arrays."""
    if gradient is None:
        return None
    check_gradient_fn(gradient)
    state = gradient.init(params)
    if not jax.tree.leaves(state):  # DP-SGD's {"noise": (), "clip": ()}: nothing to carry
        return None
    return jax.tree.map(_fresh, state)


def check_train_state(state: Any, what: str = "state") -> None:
    """``TypeError`` unless ``state`` is a jaxwise `TrainState` (a Flax one is not)."""
    if isinstance(state, TrainState):
        return
    kind = f"{type(state).__module__}.{type(state).__qualname__}"
    hint = ""
    if "flax" in kind:
        hint = (
            "; a Flax TrainState keeps `apply_fn` and `tx` inside it: build a jaxwise state with "
            "`jaxwise.train.TrainState.create(flax_state.params, flax_state.tx, key)`"
        )
    raise TypeError(
        f"`{what}` must be a jaxwise.train.TrainState (from "
        "`TrainState.create(params, tx, key)`), "
        f"got {kind}{hint}"
    )


def as_key(key: Any) -> jax.Array:
    """A typed PRNG key from a typed key, a raw uint32 key (``PRNGKey``) or an int seed."""
    if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
        return jax.random.key(int(key))
    if isinstance(key, jax.Array) and is_key(key):
        if key.shape != ():
            raise ValueError(f"`key` must be a single key (shape ()), got shape {key.shape}")
        return key
    if isinstance(key, (jax.Array, np.ndarray)) and key.dtype == np.uint32 and key.shape == (2,):
        return jax.random.wrap_key_data(jnp.asarray(key))
    raise TypeError(
        "`key` must be a typed key (jax.random.key), a raw uint32[2] key or an int seed, "
        f"got {key!r}"
    )


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TrainState:
    """Everything a training step reads and writes, as one pytree.

    Leaves: ``step`` (int32 scalar), ``params``, ``opt_state``, ``key`` (a
    typed PRNG key), ``model_state`` (non-trainable state such as BatchNorm
    running statistics; ``None`` — an empty pytree — when unused) and ``gradient_state``
    (the state of the [`GradientFn`][jaxwise.train.GradientFn], one opaque pytree beside
    the optimizer's: DP noise buffers, an adaptive clip norm, a dynamic loss scale; ``None``
    when it has none). ``tx``,
    the optimizer, is a *static* field as in Flax's ``TrainState`` (the programs read it
    there: it is never passed a second time). Changing it recompiles once; nothing else about
    the state ever does, because
    [`create`][jaxwise.train.TrainState.create] builds every array independently with a
    fixed, strong dtype.
    Configuration of your own is a named static field of a subclass (with
    ``@jax.tree_util.register_dataclass`` and ``@dataclasses.dataclass(frozen=True)``,
    ``dataclasses.field(default=..., metadata=dict(static=True))``): part of the tree
    structure, not a leaf, saved with checkpoints and compared on restore.

    Attributes:
        step: int32 scalar, the number of updates applied.
        params: the parameter pytree.
        opt_state: the optimizer's state for ``params``.
        key: a typed PRNG key, split by every step or epoch that draws randomness.
        model_state: non-trainable state (a pytree), or ``None``.
        gradient_state: the gradient function's state (``gradient.init(params)``), or
            ``None`` when it keeps none.
        tx: the optimizer (static).

    Examples:
        >>> import dataclasses, jax, jax.numpy as jnp
        >>> from jaxwise import optim
        >>> @jax.tree_util.register_dataclass
        ... @dataclasses.dataclass(frozen=True)
        ... class DeepState(TrainState):
        ...     depth: int = dataclasses.field(default=1, metadata=dict(static=True))
        >>> tx = optim.adam(1e-3)
        >>> state = DeepState.create({"w": jnp.ones(3)}, tx, jax.random.key(0), depth=2)
        >>> int(state.step), state.depth
        (0, 2)
    """

    step: jax.Array
    params: Any
    opt_state: Any
    key: jax.Array
    model_state: Any = None
    gradient_state: Any = None
    tx: optax.GradientTransformation | None = dataclasses.field(
        default=None, metadata=dict(static=True, saved=False)
    )

    @classmethod
    def create(
        cls,
        params: optax.Params,
        tx: optax.GradientTransformation,
        key: jax.Array | int,
        *,
        model_state: ModelState = None,
        gradient: Any = None,
        **static: Any,
    ) -> Self:
        """A fresh state: copies of ``params``, ``tx.init`` state, step 0, a typed key.

        Args:
            params: the parameter pytree (copied: donating the state never
                deletes the caller's arrays): floating-point leaves only. Not a model
                object: split a Flax or Equinox model first (``jaxwise.models.from_nnx``
                / ``from_linen`` / ``from_equinox``) and pass its ``params``.
            tx: the optimizer, a ``GradientTransformation`` (jaxwise or Optax), kept in the
                state (static).
            key: typed key, raw ``PRNGKey`` or int seed.
            model_state: non-trainable state (BatchNorm statistics…), any
                pytree of arrays (copied too); ``None`` when unused.
            gradient: the [`GradientFn`][jaxwise.train.GradientFn] the state is trained
                with: its ``init(params)`` becomes ``gradient_state``, made here once (a
                program refuses a ``None`` state for a gradient whose state has arrays);
                ``None``, or a state without arrays: ``gradient_state`` stays ``None``.
            **static: values of a subclass's static fields (hashable), by name.

        Returns:
            The state at step 0, every array a fresh buffer with a strong dtype.

        Raises:
            TypeError: ``tx`` has no ``init``/``update``, ``params`` or
                ``model_state`` has a leaf that is not a (floating-point) array or is a model
                object, ``key`` is not a key or seed, a static value is not hashable, or a
                name in ``static`` is not a static field of ``cls``.
            ValueError: ``key`` is a batch of keys.
        """
        check_optimizer(tx, "tx")
        check_params(params)
        check_not_a_model(model_state, "model_state")
        check_alive(model_state, "model_state")
        for name, leaf in zip(path_names(model_state), jax.tree.leaves(model_state)):
            if not isinstance(leaf, (jax.Array, np.ndarray, np.generic, float, int)):
                raise TypeError(
                    f"`model_state` leaf `{name}` must be an array, got {type(leaf).__name__}"
                )
        params, model_state, opt_state = _build(params, model_state, tx)
        gradient_state = init_gradient_state(gradient, params)
        fields = _static_fields(cls, static)
        for name, value in fields.items():
            try:
                hash(value)
            except TypeError as err:
                raise TypeError(
                    f"static `{name}` must be hashable (it is part of the jit cache key), "
                    f"got {value!r}"
                ) from err
        return cls(
            step=jnp.zeros((), jnp.int32),
            params=params,
            opt_state=opt_state,
            key=_fresh(as_key(key)),
            model_state=model_state,
            gradient_state=gradient_state,
            tx=tx,
            **fields,
        )

    def replace(self, **changes: Any) -> TrainState:
        """``dataclasses.replace(self, **changes)``.

        Args:
            **changes: new values of fields, by name.

        Returns:
            A new state; ``self`` is unchanged.
        """
        return dataclasses.replace(self, **changes)


def _static_fields(cls: type, static: dict[str, Any]) -> dict[str, Any]:
    """``static`` checked against ``cls``'s own static fields (``TypeError`` naming a stranger)."""
    own = {f.name for f in dataclasses.fields(cls) if f.metadata.get("static")} - {"tx"}
    for name in static:
        if name not in own:
            raise TypeError(
                f"`{name}` is not a static field of {cls.__name__} (its static fields: "
                f"{sorted(own) or 'none'}): declare it on a subclass, "
                f"`{name}: T = dataclasses.field(default=..., metadata=dict(static=True))`"
            )
    return static


def type_signature(tree: PyTree) -> list[tuple[str, tuple[int, ...], str, bool]]:
    """``(path, shape, dtype, weak_type)`` of every leaf: what ``jit`` keys its cache on.

    Args:
        tree: any pytree of arrays (or Python scalars).

    Returns:
        One ``(path, shape, dtype name, weak_type)`` per leaf, in flatten order.

    Examples:
        >>> import jax.numpy as jnp
        >>> type_signature({"a": jnp.ones(2), "n": 3})
        [('a', (2,), 'float32', False), ('n', (), 'int32', True)]
    """
    out = []
    for name, leaf in zip(path_names(tree), jax.tree.leaves(tree)):
        aval = jax.typeof(leaf)
        out.append(
            (name, tuple(aval.shape), str(aval.dtype), bool(getattr(aval, "weak_type", False)))
        )
    return out

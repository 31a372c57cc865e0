"""Models: jaxwise's own MLP, and adapters for Flax NNX, Flax linen and Equinox models.

``init_mlp``/``mlp_apply`` are a small ReLU MLP as plain functions (parameters are a dict
``dense_i/{w, b}``). ``from_nnx``, ``from_linen`` and ``from_equinox`` turn a model of those
libraries into ``Model(params, model_state, apply)`` with a pure ``apply(params, model_state,
*args, **kwargs) -> (out, new_model_state)``, which every jaxwise training and per-example
function accepts. A model object passed where parameters belong is a ``TypeError`` naming
the adapter to use, at every public function that takes parameters.

Examples:
    >>> import jax, jax.numpy as jnp
    >>> params = init_mlp(jax.random.key(0), (2, 64, 64, 3))
    >>> mlp_apply(params, jnp.ones((5, 2))).shape
    (5, 3)
"""

from jaxwise.models._adapters import Model, from_equinox, from_linen, from_nnx
from jaxwise.models._mlp import init_mlp, mlp_apply, mlp_loss

__all__ = [
    "Model",
    "from_equinox",
    "from_linen",
    "from_nnx",
    "init_mlp",
    "mlp_apply",
    "mlp_loss",
]

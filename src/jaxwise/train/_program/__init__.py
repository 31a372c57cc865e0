"""The compiled program: what runs inside ``jax.jit``.

`TrainState` (``_state``), the gradient protocol and its builders (``_gradient``,
``_precision``), the sampler protocol and every sampler (``_sampling``, ``_sampler``), the
one update path (``_update``), and the two programs made of them, a step (``_step``) and a
scanned epoch (``_epoch``), with the donation audit around each call (``_donation``). Nothing
here imports the host loop (``jaxwise.train._loop``).
"""

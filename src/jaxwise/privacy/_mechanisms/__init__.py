"""The noise mechanisms: what a DP step adds to a clipped sum, and the protocols they plug into.

``_protocols``: `NoiseMechanism`, `ClipPolicy`, `DPAccounting`, the pairing of a mechanism
with a sampler's facts and the check that each part issues its own accounting event;
``_noise``: the one noising step (one flat standard-normal draw); ``_privatizer``: that step
as an Optax transformation; ``_bandmf``, ``_blt`` and their float64 Toeplitz algebra
(``_toeplitz``): correlated noise. Imports neither clipping nor accounting.
"""

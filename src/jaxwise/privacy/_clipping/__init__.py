"""Clipping: the DP gradient is the clipped sum of per-example gradients plus its clip policy.

``_dpgradient``: `dp_gradient_fn` / `dp_gradient` (clip, sum, the step's noise through
``_mechanisms``); ``_adaptive``: `AdaptiveClip`, a clip norm that follows a private quantile;
``_unit``: `unit_clip`, the released gradient divided by its clip norm.
"""

"""Accounting: (ε, δ) of a run from the plan of its sampler, mechanism and clip policy.

``_accountant``: dp-accounting's RDP or PLD accountant over one `PrivacyPlan`, and the σ for
a target ε; ``_choose``: the mechanism with the lowest expected error at a target ε.
Imports the mechanisms, never clipping.
"""

"""The host loop: `fit` drives a compiled program over host batches.

``_fit`` is the loop (prefetch, NaN-guard counts, resume); ``_callbacks`` the `Callback`
protocol and the run a callback sees; ``_standard_callbacks`` the callbacks jaxwise ships
(checkpointing, metric logging, the progress bar, early stopping); ``_data_state``,
``_fingerprint`` and ``_trained`` what is saved beside a checkpoint to resume over the same
data. It imports the program (``jaxwise.train._program``), never the other way round.
"""

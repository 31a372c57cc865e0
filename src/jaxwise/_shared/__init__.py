"""The private implementation shared by jaxwise's packages (no public names).

A helper two packages need lives here, one concern per module (`_checks`: argument
validation; `_jax`: the one reader of JAX internals; `_events`: the in-process channel watch
listens on; ...). Packages import these modules directly; `docs/design.md` places them in
the layering table. Importing this package imports nothing.
"""

#!/usr/bin/env bash
# Run ON the TPU machine, from the repository root: installs jaxwise's test needs beside the
# image's own JAX (never replacing it). The machine's package index (file:///opt/pypi/simple)
# gives most peers, pinned to the image's jax/jaxlib/numpy; the wheels in .whl-tpu (wheels.sh)
# give the rest. Everything goes to $SITE, appended to PYTHONPATH by env.sh.
set -u
# The image's JAX is installed for its Python 3.11; the checkout's .python-version (3.12) would
# make pyenv's python3 another Python, so pick the 3.11 that pyenv has.
for v in $(pyenv versions --bare 2>/dev/null); do case $v in 3.11*) export PYENV_VERSION=$v ;; esac; done
SITE=${SITE:-/tmp/site}
mkdir -p "$SITE"
export PIP_CONFIG_FILE=/dev/null
python3 - > /tmp/constraints.txt <<'PY'
import importlib.metadata as m
for name in ("jax", "jaxlib", "numpy", "scipy"):
    print(f"{name}=={m.version(name)}")
PY
index=(--isolated -q --no-cache-dir --no-compile --only-binary=:all:
       --index-url file:///opt/pypi/simple --target "$SITE")
peers=(optax flax orbax-checkpoint rich matplotlib tensorboard pytest pytest-timeout hypothesis
       pandas absl-py mpmath pydantic cloudpickle etils protobuf jaxtyping wadler-lindig toolz
       packaging)
if ! python3 -m pip install "${index[@]}" -c /tmp/constraints.txt "${peers[@]}"; then
  echo "setup: one install from the index failed; installing one at a time" >&2
  for p in "${peers[@]}"; do
    python3 -m pip install "${index[@]}" -c /tmp/constraints.txt "$p" || echo "setup: no $p" >&2
  done
fi
if ls .whl-tpu/*.whl >/dev/null 2>&1; then
  python3 -m pip install --isolated -q --no-index --no-deps --no-compile --no-cache-dir \
    --upgrade --target "$SITE" .whl-tpu/*.whl
fi

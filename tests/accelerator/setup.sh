#!/usr/bin/env bash
# Run ON the TPU machine, from the repository root: installs jaxwise's test needs beside the
# image's own JAX (never replacing it). The machine's package index (file:///opt/pypi/simple)
# gives most peers, pinned to the image's jax/jaxlib/numpy; the wheels in .whl-tpu (wheels.sh)
# give the rest, and mlflow-skinny with what of its dependencies the index lacks
# (.whl-tpu/mlflow). jaxwise itself is installed too (--no-deps), so that its pytest11 entry
# point exists; its code is still imported from the checkout (env.sh puts src/ first).
# Everything goes to $SITE, appended to PYTHONPATH by env.sh.
#
# Idempotent and quick the second time: a stamp in $SITE records what was installed (the
# lists below and the carried wheels); the same again is skipped.
set -u
# The image's JAX is installed for its Python 3.11; the checkout's .python-version (3.12) would
# make pyenv's python3 another Python, so pick the 3.11 that pyenv has.
for v in $(pyenv versions --bare 2>/dev/null); do case $v in 3.11*) export PYENV_VERSION=$v ;; esac; done
SITE=${SITE:-/tmp/site}
mkdir -p "$SITE"
export PIP_CONFIG_FILE=/dev/null
peers=(optax flax orbax-checkpoint rich matplotlib tensorboard pytest pytest-timeout hypothesis
       pandas absl-py mpmath pydantic cloudpickle etils protobuf jaxtyping wadler-lindig toolz
       packaging)
stamp="$SITE/.jaxwise-setup"
want=$( { echo "${peers[*]}"; ls .whl-tpu .whl-tpu/mlflow 2>/dev/null; cat pyproject.toml; } | cksum)
if [ -e "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  echo "setup: already done ($SITE)"
  exit 0
fi
python3 - > /tmp/constraints.txt <<'PY'
import importlib.metadata as m
for name in ("jax", "jaxlib", "numpy", "scipy"):
    print(f"{name}=={m.version(name)}")
PY
index=(--isolated -q --no-cache-dir --no-compile --only-binary=:all:
       --index-url file:///opt/pypi/simple --target "$SITE")
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
# mlflow-skinny: its dependencies from the index where it has them, else the carried ones;
# what $SITE already holds stays as it is (its versions are constraints).
if ls .whl-tpu/mlflow/mlflow_skinny-*.whl >/dev/null 2>&1; then
  python3 - "$SITE" >> /tmp/constraints.txt <<'PY'
import importlib.metadata as m, sys
for d in m.distributions(path=[sys.argv[1]]):
    print(f"{d.metadata['Name']}=={d.version}")
PY
  python3 -m pip install "${index[@]}" --find-links .whl-tpu/mlflow -c /tmp/constraints.txt \
    mlflow-skinny \
    || echo "setup: no mlflow-skinny (its tests skip, naming it)" >&2
fi
# jaxwise itself, for its pytest11 entry point: the carried wheel, else built from the checkout
if ! ls .whl-tpu/jaxwise-*.whl >/dev/null 2>&1; then
  python3 -m pip install --isolated -q --no-deps --no-build-isolation --no-compile \
    --no-cache-dir --upgrade --target "$SITE" . \
    || echo "setup: jaxwise not installed (run the lane with -p jaxwise.pytest_plugin)" >&2
fi
echo "$want" > "$stamp"

#!/usr/bin/env bash
# Run HERE (a machine with internet): downloads, into .whl-tpu/, the wheels that a TPU machine's
# own package index lacks (equinox, chex, grain, dp-accounting, jax-privacy, tensorboardX), for its
# Python 3.11 on x86-64; into .whl-tpu/mlflow/, mlflow-skinny and its dependencies (setup.sh
# takes each from the machine's index where it has it); and builds jaxwise's own wheel (its
# pytest11 entry point). setup.sh installs them there. .whl-tpu/ stays out of git; about 25 MB.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
if [ -x .venv/bin/python ]; then PY=${PYTHON:-.venv/bin/python}; fi
mkdir -p .whl-tpu/mlflow
platforms=()
for p in manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
target=(--only-binary=:all: --python-version 3.11 --implementation cp "${platforms[@]}")
"$PY" -m pip download -q --no-deps "${target[@]}" -d .whl-tpu \
  equinox==0.13.8 chex==0.1.92 grain==0.2.18 dp-accounting==0.6.0 jax-privacy==2.0.0 \
  tensorboardX==2.6.5 array-record==0.8.3 attrs==23.2.0 dm-tree==0.1.9 portpicker==1.6.0 psutil==7.1.0
# mlflow-skinny (the newest lane's version) with its whole dependency closure
"$PY" -m pip download -q "${target[@]}" --platform any -d .whl-tpu/mlflow mlflow-skinny==3.18.0
rm -f .whl-tpu/jaxwise-*.whl
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w .whl-tpu .
ls .whl-tpu .whl-tpu/mlflow
du -sh .whl-tpu

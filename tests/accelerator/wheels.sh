#!/usr/bin/env bash
# Run HERE (a machine with internet): downloads, into .whl-tpu/, the wheels that a TPU machine's
# own package index lacks (equinox, chex, grain, dp-accounting, jax-privacy, tensorboardX), for its
# Python 3.11 on x86-64. setup.sh installs them there. .whl-tpu/ stays out of git.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl-tpu
platforms=()
for p in manylinux_2_31 manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
  platforms+=(--platform "${p}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
  "${platforms[@]}" -d .whl-tpu \
  equinox==0.13.8 chex==0.1.92 grain==0.2.18 dp-accounting==0.6.0 jax-privacy==2.0.0 \
  tensorboardX==2.6.5 array-record==0.8.3 attrs==23.2.0 dm-tree==0.1.9 portpicker==1.6.0 psutil==7.1.0
ls .whl-tpu

#!/usr/bin/env bash
# Run ON the TPU machine, from the repository root: the whole test suite in ONE process (one
# process holds the chip), JUnit XML and the log into ${OUT:-build/accelerator}. Arguments go
# to pytest (e.g. -m "not slow"). tests/ACCELERATOR.md records the last run.
set -u
out=${OUT:-build/accelerator}
mkdir -p "$out"
source tests/accelerator/env.sh
python3 - <<'PY' | tee "$out/environment.txt"
import jax, sys
d = jax.devices()[0]
print("python", sys.version.split()[0], "jax", jax.__version__, "backend", jax.default_backend(),
      "device", d.device_kind, "count", jax.device_count())
PY
python3 -m pytest -p jaxwise.pytest_plugin -p no:cacheprovider -v -rs --timeout 300 \
  --basetemp=/tmp/pytest-accel --junitxml="$out/junit.xml" "$@" 2>&1 | tee "$out/pytest.log" \
  | tail -n 400

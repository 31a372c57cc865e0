#!/usr/bin/env bash
# The TPU lane, run ON the TPU machine from the repository root, ONE command per chunk:
#
#   bash tests/accelerator/lane.sh plan        # the chunks and their estimated minutes
#   bash tests/accelerator/lane.sh setup       # the installs alone (optional first call)
#   bash tests/accelerator/lane.sh K [ARGS]    # chunk K (0, 1, ...); ARGS go to pytest
#
# Each call: setup.sh (quick when already done on this machine), then chunk K's units in one
# pytest process (`-m "not slow"` unless ARGS give -m), stopped by SIGINT after LANE_SECONDS
# (default 540: a device command may run 600) so that its JUnit XML is still written. Run
# the same command again to resume a stopped chunk: the units it completed are skipped (the
# record build/accelerator/record-K.jsonl, kept on the machine while it stays warm). A
# completed chunk is not run again (LANE_FRESH=1 starts it over).
#
# JAX's persistent compilation cache (every program: no minimum compile time or size) lives
# in LANE_CACHE (default /tmp/jaxwise-lane-cache) across chunks while the machine stays
# warm; LANE_CACHE=off runs without it.
#
# Into $OUT (default build/accelerator/out), at most 6 files: junit-K-A.xml and
# pytest-K-A.log (A = the attempt), record-K.jsonl, environment-K.json, compiles-K.json,
# chunk-K.json (wall seconds, exit code, units done). `python3 tests/accelerator/merge.py
# DIR...` (on any machine) merges them into one record and tests/ACCELERATOR.md.
set -u
cd "$(dirname "$0")/../.."
# the image's Python 3.11 (the checkout's .python-version names 3.12, which pyenv may lack)
for v in $(pyenv versions --bare 2>/dev/null); do case $v in 3.11*) export PYENV_VERSION=$v ;; esac; done
if [ "${1:-}" = plan ] || [ -z "${1:-}" ]; then
  exec python3 tests/accelerator/plan.py
fi
if [ "$1" = setup ]; then  # the installs alone (a first call), so that chunks start at once
  bash tests/accelerator/setup.sh
  exit $?
fi
k=$1
shift
start=$(date +%s)
budget=${LANE_SECONDS:-540}
keep=$PWD/build/accelerator  # absolute: tests change the working directory
out=${OUT:-$keep/out}
mkdir -p "$keep" "$out"
record=$keep/record-$k.jsonl
if [ "${LANE_FRESH:-0}" = 1 ]; then
  rm -f "$record" "$keep/complete-$k" "$keep/chunk-$k.json" "$keep"/junit-"$k"-*.xml
fi
if [ -e "$keep/complete-$k" ]; then
  echo "lane: chunk $k already complete on this machine (LANE_FRESH=1 runs it again)"
  exit 0
fi

if [ "${LANE_SETUP:-1}" != 0 ]; then  # LANE_SETUP=0: the current environment as it is
  bash tests/accelerator/setup.sh || echo "lane: setup.sh failed; running with what is installed" >&2
  source tests/accelerator/env.sh
fi
export PYTHONPATH="$PWD/tests/accelerator${PYTHONPATH:+:$PYTHONPATH}"
py=${LANE_PYTHON:-python3}

units=$(python3 tests/accelerator/plan.py "$k") || exit 2
done_units=""
if [ -e "$record" ]; then
  done_units=$(python3 -c 'import json,sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "done" in r: print(r["done"])' "$record" | sort -u)
fi
todo=()
for u in $units; do
  if ! grep -qxF "$u" <<<"$done_units"; then todo+=("$u"); fi
done
attempt=$(python3 -c 'import json, sys, pathlib
p = pathlib.Path(sys.argv[1])
print(len(json.loads(p.read_text())["attempts"]) + 1 if p.exists() else 1)' "$keep/chunk-$k.json")
echo "lane: chunk $k attempt $attempt: ${#todo[@]} of $(wc -w <<<"$units") units to run"

if [ "${LANE_CACHE:-/tmp/jaxwise-lane-cache}" != off ]; then
  export JAX_COMPILATION_CACHE_DIR=${LANE_CACHE:-/tmp/jaxwise-lane-cache}
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES=0
  mkdir -p "$JAX_COMPILATION_CACHE_DIR"
fi
export LANE_RECORD=$record LANE_ENVIRONMENT=$keep/environment-$k.json
export LANE_COMPILES=$keep/compiles-$k-$attempt.json
marker=(-m "not slow")
for a in "$@"; do if [ "$a" = -m ]; then marker=(); fi; done
# jaxwise's pytest plugin loads by its entry point (setup.sh installs jaxwise); name it where
# the install did not happen. Hypothesis' plugin imports libcst, whose import warns: off.
plugin=()
"$py" -c 'import importlib.metadata as m, sys
sys.exit(not any(e.value == "jaxwise.pytest_plugin" for e in m.entry_points(group="pytest11")))' \
  || plugin=(-p jaxwise.pytest_plugin)
per_test=()  # pytest-timeout (setup.sh installs it): no test may hang the chunk
"$py" -c 'import pytest_timeout' 2>/dev/null && per_test=(--timeout 300)
left=$(( budget - ($(date +%s) - start) ))
if [ "$left" -lt 60 ]; then
  echo "lane: setup took this call's time ($(( budget - left )) s); run the same command again" >&2
  exit 3
fi
pytest_start=$(date +%s)
code=0
if [ ${#todo[@]} -gt 0 ]; then
  timeout -s INT -k 30 "$left" "$py" -m pytest "${plugin[@]}" -p lane_progress \
    -p no:hypothesispytest -p no:cacheprovider -v -rs "${per_test[@]}" \
    --basetemp=/tmp/pytest-lane-$k --junitxml="$keep/junit-$k-$attempt.xml" \
    "${marker[@]}" "${todo[@]}" "$@" >"$keep/pytest-$k-$attempt.log" 2>&1
  code=$?
fi
wall=$(( $(date +%s) - pytest_start ))
tail -n 25 "$keep/pytest-$k-$attempt.log" 2>/dev/null
# pytest's exit codes 0 (passed), 1 (some failed) and 5 (nothing left to collect: the rest
# is slow) mean it ran every unit to the end; 2 or 124 (stopped), 137 (killed) do not
case $code in 0 | 1 | 5) touch "$keep/complete-$k" ;; esac
python3 - "$k" "$attempt" "$code" "$wall" "$keep" "${units//$'\n'/ }" <<'PY'
import json, sys
from pathlib import Path
k, attempt, code, wall, keep, units = sys.argv[1:7]
record = Path(keep) / f"record-{k}.jsonl"
done = sorted({json.loads(l).get("done") for l in record.open()} - {None}) if record.exists() else []
path = Path(keep) / f"chunk-{k}.json"
old = json.loads(path.read_text()) if path.exists() else {"attempts": []}
old["attempts"].append({"attempt": int(attempt), "exit": int(code), "wall_s": int(wall)})
old.update(chunk=int(k), units=units.split(), done=done,
           complete=(Path(keep) / f"complete-{k}").exists())
path.write_text(json.dumps(old, indent=1) + "\n")
print(f"lane: chunk {k} attempt {attempt}: exit {code}, {wall} s, "
      f"{len(done)}/{len(units.split())} units done, complete={old['complete']}")
PY
cp "$keep/junit-$k-$attempt.xml" "$keep/pytest-$k-$attempt.log" "$record" \
  "$keep/environment-$k.json" "$LANE_COMPILES" "$keep/chunk-$k.json" "$out"/ 2>/dev/null
exit "$code"

#!/bin/bash
# On the H200 machine, from the checkout root, with .gpu/ (the testbed bundle) and .whl/ (eaglepatch and libcst
# wheels for Python 3.12) carried along. One call does the whole story; results go to $OUT.
#   bash benchmarks/gpu/venv_story.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/eagle_out}
mkdir -p "$OUT/more"
T0=$(date +%s)
# Unpack the testbed's bundle into /tmp/site and check that sglang imports (no phases: no server yet).
PHASES= CACHE_OUT=0 OUT="$OUT/more" bash .gpu/run_real.sh > "$OUT/more/setup.log" 2>&1 || { tail -30 "$OUT/more/setup.log"; exit 2; }
tail -3 "$OUT/more/setup.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ep .whl/*.whl || exit 3
echo "eaglepatch installed at $(( $(date +%s) - T0 ))s"
OUT="$OUT/more" GPU_DIR=$PWD/.gpu timeout "${STORY_TIMEOUT:-500}" python3 benchmarks/gpu/venv_story.py 2>&1 | tee "$OUT/more/venv_story.log"
cp "$OUT/more/venv_story.json" "$OUT/" 2>/dev/null
cp /tmp/eaglepatch/server-*.log "$OUT/more/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/more.tgz" more && rm -rf "$OUT/more"
echo "done at $(( $(date +%s) - T0 ))s"

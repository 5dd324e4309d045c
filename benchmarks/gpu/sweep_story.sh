#!/bin/bash
# On a 2-GPU H200 machine (kind nvidia-h200-x2), from the checkout root, with .gpu/ (the testbed bundle; in stage 2
# also .gpu/sweepstate/, the state files stage 1 returned) and .whl/ (eaglepatch and libcst wheels for Python 3.12)
# carried along. See sweep_story.py. Results: $OUT/sweep_story_<stage>.json, $OUT/stage<stage>.tgz.
#   STAGE=1 TWO_RANKS=1 DEADLINE=545 bash benchmarks/gpu/sweep_story.sh
#   STAGE=2 DEADLINE=560 STATE_IN=$PWD/.gpu/sweepstate bash benchmarks/gpu/sweep_story.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/eagle_out}
export T0=$(date +%s)
STAGE=${STAGE:-1}
mkdir -p "$OUT/more"
export SGLANG_ENABLE_JIT_DEEPGEMM=0  # as the testbed launches it (.gpu/run_real.sh)
# Unpack the testbed's bundle into /tmp/site and check that sglang imports (no phases: no server yet).
PHASES= CACHE_OUT=0 OUT="$OUT/more" bash .gpu/run_real.sh > "$OUT/more/setup.log" 2>&1 || { tail -30 "$OUT/more/setup.log"; exit 2; }
tail -3 "$OUT/more/setup.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ep .whl/*.whl || exit 3
echo "eaglepatch installed at $(( $(date +%s) - T0 ))s"
nvidia-smi --query-gpu=index,name,memory.used --format=csv
python3 benchmarks/gpu/sweep_story.py "$STAGE" 2>&1 | tee "$OUT/more/story.log"
rc=${PIPESTATUS[0]}
cp /tmp/eaglepatch/server-*.log "$OUT/more/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/stage$STAGE.tgz" more && rm -rf "$OUT/more"
echo "stage $STAGE: exit $rc at $(( $(date +%s) - T0 ))s"
exit $rc

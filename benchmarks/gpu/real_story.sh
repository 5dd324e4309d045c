#!/bin/bash
# On the H200 machine, from the checkout root, with .gpu/ (the testbed bundle) and .whl/ (eaglepatch and libcst
# wheels for Python 3.12) carried along. One call does the whole story; results go to $OUT.
#   VARIANTS="spec" TIMER_CHECK=1 bash benchmarks/gpu/real_story.sh
set -uo pipefail
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/eagle_out}
mkdir -p "$OUT/more"
T0=$(date +%s)
export SGLANG_ENABLE_JIT_DEEPGEMM=0  # as the testbed launches it (.gpu/run_real.sh)
# Unpack the testbed's bundle into /tmp/site and check that sglang imports (no phases: no server yet).
PHASES= CACHE_OUT=0 OUT="$OUT/more" bash .gpu/run_real.sh > "$OUT/more/setup.log" 2>&1 || { tail -30 "$OUT/more/setup.log"; exit 2; }
tail -3 "$OUT/more/setup.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ep .whl/*.whl || exit 3
echo "eaglepatch installed at $(( $(date +%s) - T0 ))s"
if [ "${TIMER_CHECK:-0}" = 1 ]; then
  python3 benchmarks/gpu/timer_check.py --out "$OUT/timer_check.json" > "$OUT/more/timer_check.log" 2>&1
  tail -5 "$OUT/more/timer_check.log"
fi
for v in ${VARIANTS:-spec}; do
  OUT="$OUT/more" GPU_DIR=$PWD/.gpu timeout "${STORY_TIMEOUT:-480}" python3 benchmarks/gpu/real_story.py "$v" 2>&1 | tee "$OUT/more/story_$v.log"
  cp "$OUT/more/story_$v.json" "$OUT/" 2>/dev/null
done
cp /tmp/eaglepatch/server-*.log "$OUT/more/" 2>/dev/null
tar -C "$OUT" -czf "$OUT/more.tgz" more && rm -rf "$OUT/more"
echo "done at $(( $(date +%s) - T0 ))s"

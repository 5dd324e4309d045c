#!/bin/bash
# On the H200 machine (kind nvidia-h200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/
# (eaglepatch and libcst wheels for Python 3.12) carried along. One call of at most 10 minutes (cost_story.py):
# the runtime's host parts on real CUDA (runtime_parts.py), then the GPU-bound server of Llama-3-8B shape launched
# unpatched, patched (events) and unpatched again, each loaded WINDOWS times with the same client.
# Results: $OUT/cost_story.json, $OUT/more.tgz (server, setup and story logs, timing logs).
#   BUDGET=540 bash benchmarks/gpu/cost_story.sh
#   PHASES=u,e,u,e PARTS= bash benchmarks/gpu/cost_story.sh    (PARTS: the batch sizes of runtime_parts.py; none)
BUDGET=${BUDGET:-540}
source benchmarks/gpu/prelude.sh
nvidia-smi --query-gpu=index,name,memory.used,clocks.sm,clocks.max.sm --format=csv
for bs in ${PARTS-1 4}; do
  python3 benchmarks/gpu/runtime_parts.py --bs $bs --out "$OUT/runtime_parts_bs$bs.json" > "$OUT/more/parts_bs$bs.log" 2>&1 \
    || tail -20 "$OUT/more/parts_bs$bs.log"
  head -c 1500 "$OUT/more/parts_bs$bs.log"; echo
done
echo "parts done at $(( $(date +%s) - T0 ))s"
run_story cost_story

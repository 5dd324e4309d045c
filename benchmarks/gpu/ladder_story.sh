#!/bin/bash
# On the GPU machine (an H100 or H200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/ (the libcst
# wheel for Python 3.12; eaglepatch from this checkout's source) carried along. One call of at most 10 minutes
# (ladder_story.py): the runtime's host parts at PARTS batch sizes (runtime_parts.py), then the Llama-3-8B-shaped
# server launched per phase and loaded over the concurrency ladder. Results: $OUT/ladder_story.json,
# $OUT/runtime_parts_bs*.json, $OUT/more.tgz (server, setup and story logs, timing logs).
#   PHASES=s5,b0 PARTS="1 64 256" bash benchmarks/gpu/ladder_story.sh
#   PHASES=s1,s3 PARTS= bash benchmarks/gpu/ladder_story.sh                 (the measured truth at other steps)
BUDGET=${BUDGET:-540}
source benchmarks/gpu/prelude.sh
nvidia-smi --query-gpu=index,name,memory.used,clocks.sm,clocks.max.sm --format=csv
for bs in ${PARTS-1 64 256}; do
  python3 benchmarks/gpu/runtime_parts.py --bs $bs --out "$OUT/runtime_parts_bs$bs.json" > "$OUT/more/parts_bs$bs.log" 2>&1 \
    || tail -20 "$OUT/more/parts_bs$bs.log"
  head -c 600 "$OUT/more/parts_bs$bs.log"; echo
done
echo "parts done at $(( $(date +%s) - T0 ))s"
run_story ladder_story

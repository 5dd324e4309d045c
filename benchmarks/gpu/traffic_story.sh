#!/bin/bash
# On the GPU machine (an H100 or H200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/ (the libcst
# wheel for Python 3.12; eaglepatch from this checkout's source unless its wheel is there too) carried along. One call
# of at most 10 minutes (traffic_story.py, issue 39): models of two regions (make_known_models.py --regions 0.9,0.2),
# two prompt sets (region_prompts.py: codeish text in region A, chatty chat messages in region B), the server at 3
# steps patched, bench of each set against its exact accept length, bench of chatty under other traffic (codeish,
# then chatty), and a restart sweep per set (--grid speculative-num-steps=1,6 --keep-best). Results:
# $OUT/traffic_story.json (its "summary" at the end), $OUT/more.tgz (server, setup and story logs, timing logs).
# The whole story takes about 9 minutes (run it with timeout_s 600): a stage that no longer fits BUDGET is skipped
# and named in the summary's "skipped"; a later call runs it (its server launched again by the bench stage).
#   bash benchmarks/gpu/traffic_story.sh                                          (BUDGET 555)
#   STAGES=bench,traffic BUDGET=300 bash benchmarks/gpu/traffic_story.sh          (no sweeps: about 4 minutes)
#   STAGES=bench,sweep_chatty BUDGET=420 bash benchmarks/gpu/traffic_story.sh     (a later call for what was skipped)
# REHEARSAL=1 OUT=/tmp/tr python3 benchmarks/gpu/traffic_story.py runs it here against the stand-in (no GPU).
BUDGET=${BUDGET:-555}
source benchmarks/gpu/prelude.sh
nvidia-smi --query-gpu=index,name,memory.used --format=csv
run_story traffic_story

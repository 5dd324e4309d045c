#!/bin/bash
# On a machine with TP GPUs (nvidia-h200-x2 for TP=2), from the checkout root, with .gpu/ (the testbed bundle)
# and .whl/ (eaglepatch's and libcst's wheels for Python 3.12) carried along. One call per stage (tp_story.py):
#   TP=2 bash benchmarks/gpu/tp_story.sh                       # stage 1: status, bench, apply, report --by rank, doctor
#   TP=2 STAGE=2 bash benchmarks/gpu/tp_story.sh               # stage 2: the sweeps (run again with
#                                                               # STATE_IN=<the state/ folder of the last call> to resume)
#   TP=1 bash benchmarks/gpu/tp_story.sh                       # stage 1 rehearsed on one GPU
# Results: $OUT/tp_story.json, $OUT/more.tgz (server log, setup and story logs, timing logs, sweep state).
source benchmarks/gpu/prelude.sh
run_story tp_story

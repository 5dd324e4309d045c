#!/bin/bash
# On the H200 machine (kind nvidia-h200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/
# (eaglepatch and libcst wheels for Python 3.12) carried along. One 9-minute call does the whole story (see
# doctor_story.py): three launches of a real sglang 0.5.16 server, each loaded, examined by eaglepatch doctor,
# stopped. Results: $OUT/doctor_story.json, and $OUT/more.tgz (server logs, setup and story logs).
#   bash benchmarks/gpu/doctor_story.sh            (SPLIT=1: four launches, if the budget allows)
BUDGET=${BUDGET:-500}
source benchmarks/gpu/prelude.sh
nvidia-smi --query-gpu=index,name,memory.used --format=csv
run_story doctor_story

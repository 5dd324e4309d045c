#!/bin/bash
# On the H200 machine (kind nvidia-h200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/
# (eaglepatch and libcst wheels for Python 3.12) carried along. One call does the whole story (runs_story.py):
# three applies into one log dir, a slow log disk, sglang's own serving benchmark beside eaglepatch's.
# Results: $OUT/runs_story.json, $OUT/more.tgz (server log, setup and story logs, the timing logs).
#   bash benchmarks/gpu/runs_story.sh
source benchmarks/gpu/prelude.sh
run_story runs_story

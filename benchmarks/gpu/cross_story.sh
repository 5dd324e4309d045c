#!/bin/bash
# On the H200 machine (kind nvidia-h200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/
# (eaglepatch and libcst wheels for Python 3.12; aiohttp's for sglang's benchmark) and .devcarry/bsext.tar.xz
# (sglang.benchmark from the 0.5.16 wheel) carried along. One call does the whole story (cross_story.py): sglang's
# own serving benchmark beside eaglepatch's bench, a slow log disk with repeats, the timer check.
# Results: $OUT/cross_story.json, $OUT/timer_check.json, $OUT/more.tgz (server log, setup and story logs).
#   bash benchmarks/gpu/cross_story.sh
source benchmarks/gpu/prelude.sh
run_story cross_story

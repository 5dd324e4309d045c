#!/bin/bash
# On the H200 machine (kind nvidia-h200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/
# (eaglepatch and libcst wheels for Python 3.12) carried along. One call of at most 10 minutes does the whole story
# (see predict_story.py): models of known acceptance made there, one launch per phase, each loaded twice through
# eaglepatch bench. Results: $OUT/predict_story.json, $OUT/more.tgz (server, setup and story logs, timing logs).
#   BUDGET=520 bash benchmarks/gpu/predict_story.sh
#   PHASES=tiny_k5,tiny_k2,tiny_base P_TINY=0.5 bash benchmarks/gpu/predict_story.sh
BUDGET=${BUDGET:-520}
source benchmarks/gpu/prelude.sh
nvidia-smi --query-gpu=index,name,memory.used --format=csv
run_story predict_story

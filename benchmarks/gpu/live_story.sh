#!/bin/bash
# On the H200 machine (kind nvidia-h200), from the checkout root, with .gpu/ (the testbed bundle) and .whl/
# (eaglepatch and libcst wheels for Python 3.12) carried along. One stage per call (live_story.py): the live sweep,
# then the restart sweep with --repeat 3 over as many calls as it takes, then the emitted adaptive config and the
# best static point launched and benched. Each call resumes from the previous call's JSON: put it where the next
# call can read it (e.g. .gpu/live_story.json, carried with .gpu/) and name it in PREV; repeat until its "done"
# is true. Results: $OUT/live_story.json (everything, the sweeps' state files included), $OUT/more.tgz (server
# logs, the sweeps' JSON, stderr and charts, setup and story logs, the timing logs).
# The draft of known acceptance: LIVE_MODELS (default /tmp/known_p70) and LIVE_P (default 0.7), made on the machine
# by benchmarks/gpu/make_known_models.py (--shape LIVE_SHAPE, default tiny) unless LIVE_MAKE says how.
#   LIVE_P=0.7 bash benchmarks/gpu/live_story.sh                                  (the first call: stage live)
#   PREV=$PWD/.gpu/live_story.json LIVE_P=0.7 bash benchmarks/gpu/live_story.sh   (the next ones, until done)
BUDGET=${BUDGET:-520}
source benchmarks/gpu/prelude.sh
nvidia-smi --query-gpu=index,name,memory.used --format=csv
run_story live_story "${STAGE:-auto}"

# Sourced by the GPU stories' scripts (run from the checkout root on the H200 machine, with .gpu/, the testbed's
# bundle, and .whl/, the wheels of libcst and (optionally: else this checkout's source) eaglepatch for Python 3.12,
# carried along): the environment, the bundle unpacked in /tmp/site (sglang importable, no server yet), eaglepatch
# installed in /tmp/ep, and
# run_story NAME [ARG...]: runs benchmarks/gpu/NAME.py within BUDGET seconds of T0, then puts NAME.json, the server
# logs and the timing logs where they come back ($OUT/NAME.json, $OUT/more.tgz), and exits with the story's code.
set -uo pipefail
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/eagle_out}
export T0=$(date +%s)
export BUDGET=${BUDGET:-540}
export SGLANG_ENABLE_JIT_DEEPGEMM=0  # as the testbed launches it (.gpu/run_real.sh)
mkdir -p "$OUT/more"
PHASES= CACHE_OUT=0 OUT="$OUT/more" bash .gpu/run_real.sh > "$OUT/more/setup.log" 2>&1 || { tail -30 "$OUT/more/setup.log"; exit 2; }
tail -3 "$OUT/more/setup.log"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/ep .whl/*.whl || exit 3
if [ ! -d /tmp/ep/eaglepatch ]; then  # no eaglepatch wheel carried (it counts against the 64 MiB): this checkout's
  cp -r eaglepatch /tmp/ep/ && cp -r patches /tmp/ep/eaglepatch/patches || exit 3  # patches/ is eaglepatch.patches
fi
echo "eaglepatch installed at $(( $(date +%s) - T0 ))s"

run_story() {
  local name=$1; shift
  # the story keeps to BUDGET itself; the timeout is a backstop 20 s later
  OUT="$OUT/more" GPU_DIR=$PWD/.gpu timeout $(( BUDGET + 20 - ($(date +%s) - T0) )) \
    python3 "benchmarks/gpu/$name.py" "$@" 2>&1 | tee "$OUT/more/$name.log"
  local rc=${PIPESTATUS[0]}
  cp "$OUT/more/$name.json" "$OUT/" 2>/dev/null
  cp /tmp/eaglepatch/server-*.log "$OUT/more/" 2>/dev/null
  tar -C /tmp -czf "$OUT/more/eplogs.tgz" eplogs 2>/dev/null
  tar -C "$OUT" -czf "$OUT/more.tgz" more && rm -rf "$OUT/more"
  echo "$name: exit $rc at $(( $(date +%s) - T0 ))s"
  exit "$rc"
}

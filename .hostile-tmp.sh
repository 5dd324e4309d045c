#!/bin/sh
# run the given pytest args with a private /tmp whose /tmp/eaglepatch belongs to another user
mount -t tmpfs tmpfs /tmp || exit 1
mkdir /tmp/eaglepatch && echo '{"v":1,"kind":"run","run":"x-1-1-fake","t":1,"host":"x","pid":1,"rank":0}' > /tmp/eaglepatch/x-1-rank0.jsonl
chown -R 65534:65534 /tmp/eaglepatch && chmod 755 /tmp/eaglepatch
cd /work/wt24 && EAGLEPATCH_TEST_CACHE=/work/main/.cache exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"

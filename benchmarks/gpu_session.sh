#!/usr/bin/env bash
# A lent GPU session's first call, one prepared script (about 5 minutes on an H200; the device tool's
# budget is 15 minutes a session, start-up included): the checks of what changed since the last GPU
# run, then the tokens/s benchmark. Results under $OUT (the device tool's folder) or ./gpu-session.
#   bash benchmarks/gpu_session.sh            STEPS=500 bash benchmarks/gpu_session.sh
# The whole GPU check (`make gpu-check`, about 7.5 minutes) is a second call when budget is left.
set -u
out=${OUT:-gpu-session}
mkdir -p "$out"
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
python=${PYTHON:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$python" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"; } > "$out/card.txt" 2>&1
cat "$out/card.txt"
timeout 150 "$python" benchmarks/gpu_check.py --only doctor,copy_stream,amp_resume --dir "$out/runs" \
    --json "$out/gpu-check.json" > "$out/gpu-check.log" 2>&1
echo "gpu_check (doctor, copy_stream, amp_resume) exited $?"
tail -6 "$out/gpu-check.log"
# shellcheck disable=SC2086  # TOKENS_ARGS: more options, word-split (a CPU try: --cpu --size tiny --no-compile)
timeout 400 "$python" benchmarks/tokens.py --rounds 2 --warmup 1 --warmup-steps 20 --steps "${STEPS:-300}" \
    ${TOKENS_ARGS:-} --json "$out/tokens.json" > "$out/tokens.log" 2>&1
echo "tokens.py exited $?"
grep -E "^(round|warm-up)" "$out/tokens.log"
"$python" -c "import json, sys; d = json.load(open(sys.argv[1])); print(json.dumps({k: d[k] for k in ('ratio', \
'tokens_per_s', 'steps_tokens_per_s', 'besides_steps_s', 'phases_s', 'mfu')}, indent=1))" "$out/tokens.json"
rm -rf "$out/runs"

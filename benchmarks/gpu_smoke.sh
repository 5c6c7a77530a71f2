#!/usr/bin/env bash
# GPU smoke + measurements, one device call: the weight-sync bench, the trainer bench and a tiny
# end-to-end run of each mode through Ray on the GPUs. Results land in $OUT.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
python3 -c "import pyarrow, matplotlib, tqdm, yaml; print('deps ok')" || echo "MISSING DEPS"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 python3 -m asyncrl.bench.sync --models qwen2.5-0.5b qwen2.5-1.5b --output $OUT/sync.jsonl 2>&1 | grep -v Warn | tail -4
timeout 100 python3 -m asyncrl.bench.trainer --model qwen2.5-0.5b --output $OUT/trainer.jsonl 2>&1 | grep -E "tokens_per_s|mfu|peak|Error"
timeout 240 python3 -m asyncrl.bench.modes --device cuda --model tiny --samples 256 --prompts-per-step 16 --n 4 --name gpu_smoke --results-dir $OUT 2>&1 | grep -E "bench modes|^\||Error|error|Traceback" | head -30

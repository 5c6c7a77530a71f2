#!/usr/bin/env bash
# actor.cuda_graphs on one GPU, in one device call (~6 minutes on an H200): first the CUDA correctness tests of
# the packed step (graph replays against eager runs of the same step, and against the FSDP path), then the
# 0.5B update at 4,096-token micro-batches with and without graphs, interleaved (new, old, new, old) because
# this update's time moves +-15% between processes; then 1.5B both ways and one torch-profiler trace of a
# graphed update. Results land in $OUT (trainer_graphs.jsonl, *.log); a summary is printed at the end.
#
#     source .devbundle/activate.sh && export RAY_AUTH_MODE=disabled PYTHONPATH=.:$PYTHONPATH && \
#         bash benchmarks/trainer_cuda_graphs.sh
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 240 python3 -m pytest -q -x tests/train/test_packed_step.py tests/train/test_lm_head.py tests/algos/test_cuda.py > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
run() {  # label, then bench arguments
  local label=$1; shift
  timeout 150 python3 -m asyncrl.bench.trainer "$@" --output "$OUT/trainer_graphs.jsonl" > "$OUT/$label.log" 2>&1 \
    || { echo "$label failed:"; tail -15 "$OUT/$label.log"; }
}
run graphs_0.5b_a --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
run fsdp_0.5b_a --model qwen2.5-0.5b --num-updates 6
run graphs_0.5b_b --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
run fsdp_0.5b_b --model qwen2.5-0.5b --num-updates 6
run graphs_1.5b --model qwen2.5-1.5b --cuda-graphs
run fsdp_1.5b --model qwen2.5-1.5b
timeout 150 python3 benchmarks/profile_trainer.py --cuda-graphs > "$OUT/profile_graphs.log" 2>&1 \
  || { echo "profile failed:"; tail -15 "$OUT/profile_graphs.log"; }
python3 - <<'PY'
import json, os
out = os.environ["OUT"]
path = f"{out}/trainer_graphs.jsonl"
for line in open(path) if os.path.exists(path) else []:
    r = json.loads(line)
    print(f"{r['model']} graphs={r['cuda_graphs']}: {r['seconds_per_update']:.3f} s/update, "
          f"{r['tokens_per_s']:,.0f} tokens/s, MFU {r['mfu']:.3f}, peak {r['peak_memory_gib']:.1f} GiB, "
          f"pg_loss {r['metrics']['actor/pg_loss']:.6f}")
PY

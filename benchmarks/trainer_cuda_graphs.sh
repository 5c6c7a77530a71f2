#!/usr/bin/env bash
# actor.cuda_graphs on one GPU, in one device call (~6 minutes on an H200): the CUDA tests of the packed step
# (graph replays against eager runs of the same step, and against the FSDP path) and of the fused LM-head
# kernels; the kernels against the torch path per chunk; the 0.5B update at 4,096-token micro-batches with and
# without graphs, interleaved (graphs, FSDP, graphs: this update's time has moved +-15% between processes); 1.5B
# with graphs; then a profile of a graphed update with its Chrome trace (gzipped). Results land in $OUT
# (tests.log, trainer.jsonl, bench.log, profile.log, trace.json.gz: few files, the device returns at most 8);
# a summary is printed at the end.
#
#     source .devbundle/activate.sh && export RAY_AUTH_MODE=disabled PYTHONPATH=.:$PYTHONPATH && \
#         bash benchmarks/trainer_cuda_graphs.sh
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 420 python3 -m pytest -q tests/train/test_packed_step.py tests/train/test_lm_head.py tests/algos/test_cuda.py \
  > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
timeout 60 python3 benchmarks/lm_head_kernels.py 2>&1 | tail -8
run() {  # label, then bench arguments; every run's log goes to one file
  local label=$1; shift
  echo "=== $label" >> "$OUT/bench.log"
  timeout 150 python3 -m asyncrl.bench.trainer "$@" --output "$OUT/trainer.jsonl" >> "$OUT/bench.log" 2>&1 \
    || { echo "$label failed:"; tail -15 "$OUT/bench.log"; }
}
run graphs_0.5b_a --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
run fsdp_0.5b --model qwen2.5-0.5b --num-updates 6
run graphs_0.5b_b --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
run graphs_1.5b --model qwen2.5-1.5b --cuda-graphs
timeout 150 python3 benchmarks/profile_trainer.py --cuda-graphs --trace "$OUT/trace.json" > "$OUT/profile.log" 2>&1 \
  || { echo "profile failed:"; tail -15 "$OUT/profile.log"; }
gzip -f "$OUT/trace.json" 2>/dev/null
python3 - <<'PY'
import json, os
path = f"{os.environ['OUT']}/trainer.jsonl"
for line in open(path) if os.path.exists(path) else []:
    r = json.loads(line)
    print(f"{r['model']} graphs={r['cuda_graphs']}: {r['seconds_per_update']:.3f} s/update, "
          f"{r['tokens_per_s']:,.0f} tokens/s, MFU {r['mfu']:.3f}, peak {r['peak_memory_gib']:.1f} GiB, "
          f"pg_loss {r['metrics']['actor/pg_loss']:.6f}, entropy {r['metrics']['actor/entropy']:.4f}")
PY

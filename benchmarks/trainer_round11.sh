#!/usr/bin/env bash
# The fused LM-head kernels on one GPU, in one device call (~6 minutes on an H200): their CUDA tests and the
# packed step's replay test, the kernels against the torch path per chunk, then the 0.5B update with CUDA graphs
# (twice) and without, and a profile with its Chrome trace (gzipped) of a graphed update. Results in $OUT.
#
#     source .devbundle/activate.sh && export RAY_AUTH_MODE=disabled PYTHONPATH=.:$PYTHONPATH && \
#         bash benchmarks/trainer_round11.sh
set -u
export PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q tests/train/test_lm_head.py tests/train/test_packed_step.py -k "fused or cuda" \
  > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
timeout 60 python3 benchmarks/lm_head_kernels.py 2>&1 | tail -8
run() {  # label, then bench arguments
  local label=$1; shift
  timeout 150 python3 -m asyncrl.bench.trainer "$@" --output "$OUT/trainer.jsonl" > "$OUT/$label.log" 2>&1 \
    || { echo "$label failed:"; tail -15 "$OUT/$label.log"; }
}
run graphs_a --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
run fsdp --model qwen2.5-0.5b --num-updates 6
run graphs_b --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
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

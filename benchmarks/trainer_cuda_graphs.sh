#!/usr/bin/env bash
# actor.cuda_graphs on one GPU, in one device call (~8 minutes on an H200): the 0.5B update at 4,096-token
# micro-batches with graphs, twice, around the same update from a baseline tree when one is given (this update's
# time has moved +-15% between processes: interleaving keeps a comparison honest), 1.5B with graphs, one AdamW step
# (torch's fused kernel against `FlatAdamW`: `benchmarks/adamw_step.py`), the LM head's statistics kernel over 1-16
# vocabulary segments (`benchmarks/lm_head_kernels.py`); the CUDA
# tests of the packed step (graph replays against eager runs of the same step, and against the FSDP path) and of
# the fused LM-head kernels; then a profile of a graphed update with its Chrome trace (gzipped). The numbers come
# first, the tests after them (they take ~4 minutes: each replay test process compiles the model). Results land
# in $OUT (trainer.jsonl, adamw.jsonl, bench.log, tests.log, profile.log, trace.json.gz: few files, the device returns
# at most 8); a summary is printed at the end.
#
#     source .devbundle/activate.sh && export RAY_AUTH_MODE=disabled PYTHONPATH=.:$PYTHONPATH && \
#         [BASELINE=.baseline [BASELINE2=.baseline2]] bash benchmarks/trainer_cuda_graphs.sh
#
# BASELINE: a folder holding another version's `asyncrl/` (e.g. `git archive HEAD~1 asyncrl | tar -x -C
# .baseline`, untracked so that the device copy carries it), benchmarked from inside that folder. BASELINE2: a
# second one, run after it (to tell two changes apart; the 1.5B run is then left out, for time). The summary lists
# the runs in order: this tree, BASELINE, BASELINE2, this tree again, 1.5B.
set -u
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name --format=csv,noheader
run() {  # label, folder to run in, then bench arguments; every run's log goes to one file
  local label=$1 folder=$2; shift 2
  echo "=== $label" >> "$OUT/bench.log"
  (cd "$folder" && timeout 150 python3 -m asyncrl.bench.trainer "$@" --output "$OUT/trainer.jsonl") \
    >> "$OUT/bench.log" 2>&1 || { echo "$label failed:"; tail -15 "$OUT/bench.log"; }
}
run graphs_0.5b_a . --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
if [ -n "${BASELINE:-}" ]; then
  run baseline_graphs_0.5b "$BASELINE" --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
fi
if [ -n "${BASELINE2:-}" ]; then
  run baseline2_graphs_0.5b "$BASELINE2" --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
fi
run graphs_0.5b_b . --model qwen2.5-0.5b --num-updates 6 --cuda-graphs
if [ -z "${BASELINE2:-}" ]; then  # a second baseline takes its time: the call must stay under 10 minutes
  run graphs_1.5b . --model qwen2.5-1.5b --cuda-graphs
fi
timeout 60 python3 benchmarks/lm_head_kernels.py >> "$OUT/bench.log" 2>&1 && grep statistics "$OUT/bench.log" | tail -6
timeout 90 python3 benchmarks/adamw_step.py --output "$OUT/adamw.jsonl" >> "$OUT/bench.log" 2>&1 \
  && tail -1 "$OUT/adamw.jsonl" || { echo "adamw_step failed:"; tail -15 "$OUT/bench.log"; }
timeout 330 python3 -m pytest -q tests/train/test_packed_step.py tests/train/test_lm_head.py tests/train/test_flat_adamw.py tests/algos/test_cuda.py \
  tests/models/test_linear_into.py > "$OUT/tests.log" 2>&1
tail -3 "$OUT/tests.log"
timeout 120 python3 benchmarks/profile_trainer.py --cuda-graphs --trace "$OUT/trace.json" > "$OUT/profile.log" 2>&1 \
  || { echo "profile failed:"; tail -15 "$OUT/profile.log"; }
gzip -f "$OUT/trace.json" 2>/dev/null
python3 - <<'PY'
import json, os
path = f"{os.environ['OUT']}/trainer.jsonl"
for line in open(path) if os.path.exists(path) else []:
    r = json.loads(line)
    print(f"{r['model']} graphs={r['cuda_graphs']}: {r['seconds_per_update']:.3f} s/update, "
          f"{r['tokens_per_s']:,.0f} tokens/s, MFU {r['mfu']:.3f}, peak {r['peak_memory_gib']:.1f} GiB, "
          f"pg_loss {r['metrics']['actor/pg_loss']:.6f}, entropy {r['metrics']['actor/entropy']:.4f}, "
          f"grad_norm {r['metrics']['actor/grad_norm']:.4f}")
PY

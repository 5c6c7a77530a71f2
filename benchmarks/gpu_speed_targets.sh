#!/usr/bin/env bash
# The numbers of the two GPU speed targets in one device call (~7 minutes on an H200): the engine's decode
# roofline fraction and tokens/s (issue 5) and the trainer's MFU (issue 4), each as docs/benchmarks.md reports
# them. Results land in $OUT (engine_*.json, trainer.jsonl); a summary is printed at the end.
set -u
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name --format=csv,noheader
for model in qwen2.5-0.5b qwen2.5-1.5b; do
  timeout 170 python3 -m asyncrl.bench.engine --model "$model" --num-requests 256 --prompt-lengths 128:1024 \
    --output-lengths 1024 --output "$OUT/engine_$model.json" > "$OUT/engine_$model.log" 2>&1 || tail -5 "$OUT/engine_$model.log"
done
for args in "qwen2.5-0.5b --num-updates 6" "qwen2.5-0.5b --micro-tokens 16384" "qwen2.5-1.5b"; do
  timeout 120 python3 -m asyncrl.bench.trainer --model $args --output "$OUT/trainer.jsonl" > /dev/null 2>&1 || echo "trainer $args failed"
done
if [ "$(nvidia-smi --list-gpus | wc -l)" -ge 2 ]; then
  timeout 150 python3 -m asyncrl.bench.trainer --model qwen2.5-1.5b --world-size 2 --output "$OUT/trainer.jsonl" > /dev/null 2>&1 \
    || echo "trainer 1.5B on two ranks failed"
fi
python3 - <<'PY'
import glob, json, os
out = os.environ["OUT"]
for path in sorted(glob.glob(f"{out}/engine_*.json")):
    engine = json.load(open(path))["engine"]
    print(f"{os.path.basename(path)}: {engine['tokens_per_s']:,.0f} tokens/s, decode roofline fraction "
          f"{engine['roofline']['fraction_of_roofline']:.3f}, peak {engine['peak_memory_bytes'] / 2**30:.1f} GiB")
for line in open(f"{out}/trainer.jsonl"):
    r = json.loads(line)
    count = r["tokens_per_update"] // r["micro_tokens"]
    checkpointing = ", activation checkpointing" if r["gradient_checkpointing"] else ""
    print(f"trainer {r['model']} ranks {r['world_size']} micro {r['micro_tokens']} x {count}{checkpointing}: "
          f"{r['seconds_per_update']:.3f} s/update, MFU {r['mfu']:.3f}, peak {r['peak_memory_gib']:.1f} GiB")
PY

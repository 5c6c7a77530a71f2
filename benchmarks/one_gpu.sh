#!/usr/bin/env bash
# The one-GPU rows of docs/benchmarks.md, most important first, each command's output in its own log:
#     bash benchmarks/one_gpu.sh outputs/gpu        # TRL must be importable by python3 (the side by side's TRL runs)
# Progress goes to RESULTS/progress (one line per command: start, end, exit code); a command that fails is logged
# and the next one runs. About 20 minutes on one H100.
set -u
results=$(realpath -m "${1:-outputs/gpu}")
mkdir -p "$results"
progress="$results/progress"
step() {  # step NAME COMMAND...: run it, its output in NAME.log
    local name=$1; shift
    echo "$(date +%T) start $name: $*" >> "$progress"
    local started=$SECONDS
    "$@" > "$results/$name.log" 2>&1
    echo "$(date +%T) end $name rc=$? $((SECONDS - started))s" >> "$progress"
}
side_by_side() { python3 benchmarks/trl_side_by_side.py --workload gpu-learn --trl-python python3 "$@"; }

step env bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv;
    python3 -c "import torch, transformers, trl, ray; print(torch.__version__, torch.version.cuda, transformers.__version__, trl.__version__, ray.__version__)"'
# 1. the warm start (SFT on the GPU), then asyncrl and TRL interleaved from it
step setup side_by_side --setup-only
step learn_1 side_by_side --order A,T,A --output "$results/learn_1.json"
# 4. rollout against trainer log-probs on the warm-started model, fused decode products and the model's own layers
step logprob_fused side_by_side --order A --output "$results/logprob_fused.json" \
    algorithm.rollout_correction.bypass_mode=false rollout.decode_products=fused
step logprob_torch side_by_side --order A --output "$results/logprob_torch.json" \
    algorithm.rollout_correction.bypass_mode=false rollout.decode_products=torch rollout.decode_attention=triton
# 1. a third asyncrl run
step learn_2 side_by_side --order A --output "$results/learn_2.json"
# 3. the default trainer path (FSDP2, one rank): the workload T micro-batches, and the config's default of 16 rows
step trainer_05b python3 -m asyncrl.cli bench trainer --model qwen2.5-0.5b --output "$results/trainer.jsonl"
step trainer_05b_16k python3 -m asyncrl.cli bench trainer --model qwen2.5-0.5b --micro-tokens 16384 \
    --num-micro-batches 2 --output "$results/trainer.jsonl"
# 2. a second TRL run
step learn_3 side_by_side --order T --output "$results/learn_3.json"
step trainer_15b python3 -m asyncrl.cli bench trainer --model qwen2.5-1.5b --output "$results/trainer.jsonl"
echo "$(date +%T) done" >> "$progress"

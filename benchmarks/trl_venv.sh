#!/usr/bin/env bash
# A virtual environment of its own for TRL's side of benchmarks/trl_side_by_side.py, so TRL's pins never
# touch asyncrl's environment. Usage (from the repository root):
#     bash benchmarks/trl_venv.sh [VENV]        # default outputs/trl-venv; prints the python to use
# torch is pinned to the release asyncrl's CPU install uses (requirements-cpu.txt): an unpinned torch would
# pull a multi-GB CUDA build.
set -euo pipefail
venv="${1:-outputs/trl-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet "torch==2.13.0" "trl==1.16.*" "transformers>=5,<6" datasets accelerate pyarrow
"$venv/bin/python" -c "import trl, transformers, torch; print('trl', trl.__version__, '| transformers', transformers.__version__, '| torch', torch.__version__)"
echo "$venv/bin/python"

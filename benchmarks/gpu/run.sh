#!/usr/bin/env bash
# The prepared GPU benchmark (issue 14 item 4): random weights in Llama-3.1-8B's shape (bf16) on
# one GPU; the verify-cost curve for 1..64 tokens, chain and tree decode step times with an
# EAGLE-3 head of that shape, EAGLE-3 training tokens/s with online features. Installs nothing
# and downloads nothing; stops after 8 minutes. From the repository root:
#
#   bash benchmarks/gpu/run.sh              # on a CUDA machine: benchmarks/gpu/results/<gpu>.json
#   bash benchmarks/gpu/run.sh --tiny       # a tiny shape on the CPU, to check the script
#
# Extra arguments go to benchmarks/gpu/gpu_bench.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/../.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
python -c "import draftsmith" 2>/dev/null || export PYTHONPATH="$PWD:${PYTHONPATH:-}"

name=tiny-cpu
if [[ " $* " != *" --tiny "* ]]; then
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
fi
out=benchmarks/gpu/results/${name}_$(date -u +%Y%m%dT%H%M%SZ).json
timeout 480 python benchmarks/gpu/gpu_bench.py --json "$out" "$@"

#!/usr/bin/env bash
# The main job on the embedded default: fetch SmolLM2-135M, train an EAGLE-3 head on the
# standard library's train split (data prepared by the trainer from the recipe), export it to
# runs/quickstart/drafter, calibrate its confidence on held-out modules, and benchmark it
# against plain generation on the bundled prompts. About 20-25 minutes on a 2-core CPU.
#
#   bash scripts/quickstart.sh [key=value ...]     (recipe overrides, e.g. max_steps=60)
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/quickstart

draftsmith fetch-model smollm2-135m
accelerate launch --config_file recipes/accelerate/cpu-2proc.yaml scripts/train.py \
    recipes/smollm2-135m/eagle3.yaml output_dir="$out" batch_size=2 "$@"
draftsmith calibrate "$out/drafter" --target smollm2-135m --data stdlib --dtype bfloat16
draftsmith bench --target smollm2-135m --drafter "artifact:$out/drafter" --dtype bfloat16 \
    --draft-tokens 4 --json "$out/bench.json"
echo "artifact: $out/drafter (calibration report: $out/drafter/calibration/report.md)"

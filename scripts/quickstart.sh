#!/usr/bin/env bash
# The main job on the embedded default: fetch SmolLM2-135M, continue held-out stdlib modules with
# it (evaluation and calibration data in the target's own words), train an EAGLE-3 head on the
# standard library's train split, export it to runs/quickstart/drafter, calibrate its confidence
# on the held-out continuations, and benchmark it against plain generation on the bundled
# prompts. About 25 minutes on a 2-core CPU.
#
#   bash scripts/quickstart.sh [key=value ...]     (recipe overrides, e.g. max_steps=60)
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/quickstart
heldout=runs/data/smollm2-135m/stdlib-heldout-continued.jsonl

draftsmith fetch-model smollm2-135m
draftsmith regenerate --target smollm2-135m --source stdlib --split heldout --dtype bfloat16 \
    --max-new-tokens 128 --batch-size 32 --max-records 512 --prompts-per-document 8 \
    --out "$heldout"
accelerate launch --config_file recipes/accelerate/cpu-2proc.yaml scripts/train.py \
    recipes/smollm2-135m/eagle3.yaml output_dir="$out" eval_data.source="$heldout" "$@"
draftsmith calibrate "$out/drafter" --target smollm2-135m --data "$heldout" --dtype bfloat16
draftsmith bench --target smollm2-135m --drafter "artifact:$out/drafter" --dtype bfloat16 \
    --draft-tokens 4 --json "$out/bench.json"
echo "artifact: $out/drafter (calibration report: $out/drafter/calibration/report.md)"

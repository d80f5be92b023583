#!/usr/bin/env bash
# The main job on the embedded default: fetch SmolLM2-135M, have it continue standard-library
# modules and chat transcripts (train modules and conversations to train on, held-out modules to
# evaluate and calibrate on: data in the target's own words), train an EAGLE-3 head, export it
# to runs/quickstart/drafter, calibrate its confidence on the held-out continuations, and
# benchmark it against plain generation on the bundled prompts. Every step runs at --dtype auto,
# the hardware's fast precision: bfloat16 on a CPU with bf16 matrix units (AMX, AVX512-BF16;
# about 30 minutes on 2 cores), float32 on one without them (46 minutes on a 2-core AVX2 EPYC).
# Rerunning it reuses the continuations.
#
#   bash scripts/quickstart.sh [key=value ...]     (recipe overrides, e.g. max_steps=60)
set -euo pipefail
cd "$(dirname "$0")/.."
out=runs/quickstart
train=runs/data/smollm2-135m/stdlib-train-continued.jsonl
chat=runs/data/smollm2-135m/chitchat-train-continued.jsonl
heldout=runs/data/smollm2-135m/stdlib-heldout-continued.jsonl

# Each stage prints its wall time, so a slow machine shows where the time goes.
stage() {
    local name=$1 start=$SECONDS
    shift
    "$@"
    echo "stage $name: $((SECONDS - start)) s" | tee -a "$out.stages.log"
}

mkdir -p "$(dirname "$out")"
: > "$out.stages.log"
stage fetch draftsmith fetch-model smollm2-135m
stage regenerate-train draftsmith regenerate --target smollm2-135m --source stdlib --split train \
    --max-new-tokens 128 --batch-size 64 --processes 2 --max-records 1024 --prompts-per-document 4 \
    --out "$train"
stage regenerate-chat draftsmith regenerate --target smollm2-135m --source chitchat-transcripts --split train \
    --max-new-tokens 128 --batch-size 64 --processes 2 --max-records 256 \
    --prompts-per-document 2 --out "$chat"
stage regenerate-heldout draftsmith regenerate --target smollm2-135m --source stdlib --split heldout \
    --max-new-tokens 128 --batch-size 64 --processes 2 --max-records 256 --prompts-per-document 8 \
    --out "$heldout"
stage train accelerate launch --config_file recipes/accelerate/cpu-2proc.yaml scripts/train.py \
    recipes/smollm2-135m/eagle3.yaml output_dir="$out" "data.source=[$train, $chat]" \
    eval_data.source="$heldout" "$@"
stage calibrate draftsmith calibrate "$out/drafter" --target smollm2-135m --data "$heldout"
stage bench draftsmith bench --target smollm2-135m --drafter "artifact:$out/drafter" \
    --json "$out/bench.json"
echo "artifact: $out/drafter (calibration report: $out/drafter/calibration/report.md)"
echo "time per stage: $out.stages.log"

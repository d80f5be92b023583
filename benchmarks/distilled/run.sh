#!/usr/bin/env bash
# Issue 15's figures: Qwen2.5-Coder-0.5B distilled toward the 1.5B
# (recipes/qwen2.5-coder-1.5b/draft-model.yaml) against the undistilled 0.5B, greedy bf16, on the
# bundled held-out code prompts and on its chat and prose prompts:
#   bash benchmarks/distilled/run.sh
# Every step resumes or skips what is already written (regeneration resumes its jsonl, training
# its checkpoints), so a killed run is continued by running it again. ON_POLICY=1 adds the 0.5B's
# own samples (DistillSpec) to the training data. Hours on a 2-core CPU.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=benchmarks/distilled
data=runs/data/qwen2.5-coder-1.5b
run=${RUN:-runs/qwen2.5-coder-1.5b-draft-model}
target=(--target qwen2.5-coder-1.5b --dtype bfloat16 --max-new-tokens 128 --batch-size 16)

for split in train heldout; do
    records=$([ $split = train ] && echo 1024 || echo 64)
    draftsmith regenerate "${target[@]}" --source stdlib --split $split --max-records $records \
        --prompts-per-document 2 --out $data/stdlib-$split-continued.jsonl
    draftsmith regenerate "${target[@]}" --source chitchat-transcripts --split $split \
        --max-records $((records / 2)) --prompts-per-document 2 \
        --out $data/chitchat-$split-continued.jsonl
    draftsmith regenerate "${target[@]}" --source chitchat --split $split --max-turns 2 \
        --max-records $((records / 2)) --out $data/chitchat-$split-answers.jsonl
done
overrides=()
if [ "${ON_POLICY:-0}" = 1 ]; then
    draftsmith regenerate "${target[@]}" --draft qwen2.5-coder-0.5b --sample --source stdlib \
        --split train --max-records 1024 --prompts-per-document 2 \
        --out $data/stdlib-train-onpolicy.jsonl
    sources=$data/stdlib-train-continued.jsonl,$data/chitchat-train-continued.jsonl
    sources=$sources,$data/chitchat-train-answers.jsonl,$data/stdlib-train-onpolicy.jsonl
    overrides=("data.source=[$sources]")
fi

# TRAIN_ARGS: more key=value overrides; ONE_PROCESS=1 trains in this process. On a CPU without
# bf16 units: ONE_PROCESS=1 TRAIN_ARGS="target_dtype=float32 mixed_precision=no".
launch=(accelerate launch --config_file recipes/accelerate/cpu-2proc.yaml scripts/train.py)
[ "${ONE_PROCESS:-0}" = 1 ] && launch=(draftsmith train)
"${launch[@]}" recipes/qwen2.5-coder-1.5b/draft-model.yaml output_dir=$run "${overrides[@]}" \
    ${TRAIN_ARGS:-}
cp $run/metrics.jsonl $out/train_metrics.jsonl

# The bundled prompts: 8 held-out stdlib functions, then 4 chat and 4 prose lines.
python - <<'PY'
import json
from importlib.resources import files

lines = files("draftsmith.decoding").joinpath("bench_prompts.jsonl").read_text().splitlines()
with open("benchmarks/distilled/prompts_code.jsonl", "w") as code, open(
    "benchmarks/distilled/prompts_chat_prose.jsonl", "w"
) as other:
    for line in lines:
        (code if json.loads(line).get("workload") == "code" else other).write(line + "\n")
PY
# Both drafts on raw confidence (the threshold policy of benchmarks/README.md's Qwen runs), back
# to back per workload; then the distilled one again once calibrated.
bench=(--target qwen2.5-coder-1.5b --dtype bfloat16 --draft-tokens 12 --min-path-confidence 0.4)
for workload in code chat_prose; do
    draftsmith bench "${bench[@]}" --prompts $out/prompts_$workload.jsonl \
        --drafter draft-model:qwen2.5-coder-0.5b --json $out/undistilled_$workload.json
    draftsmith bench "${bench[@]}" --prompts $out/prompts_$workload.jsonl \
        --drafter artifact:$run/drafter --json $out/distilled_$workload.json
done
draftsmith calibrate $run/drafter --target qwen2.5-coder-1.5b --dtype bfloat16 \
    --data $data/stdlib-heldout-continued.jsonl
for workload in code chat_prose; do
    draftsmith bench "${bench[@]}" --prompts $out/prompts_$workload.jsonl \
        --drafter artifact:$run/drafter --json $out/distilled_calibrated_$workload.json
done

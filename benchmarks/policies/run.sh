#!/usr/bin/env bash
# Issue 13's figures on SmolLM2-135M (float32) with the code+chat EAGLE-3 head
# (runs/exp13/drafter: runs/exp11/mix/drafter calibrated on held-out stdlib continuations),
# every method side by side per prompt: bash benchmarks/policies/run.sh
# THREADS=1 when the machine is shared (two threads thrash under other jobs).
set -euo pipefail
cd "$(dirname "$0")/../.."
export OMP_NUM_THREADS=${THREADS:-2}
out=benchmarks/policies
common=(--target smollm2-135m --drafter artifact:runs/exp13/drafter --dtype float32
        --max-new-tokens 64)

# The defaults (cost-aware, online recalibration), greedy, on the bundled code / chat / prose.
draftsmith bench "${common[@]}" --json $out/bench_greedy.json

# Code: the best fixed lengths, today's hand-tuned flags, cost-aware on calibrated vs raw
# confidence, side by side.
python scripts/compare_policies.py "${common[@]}" --prompts $out/bundled_code_prompts.jsonl \
    --policy fixed:max_draft_tokens=4 --policy fixed:max_draft_tokens=8 \
    --policy threshold:max_draft_tokens=12,min_path_confidence=0.4 \
    --policy cost-aware --policy cost-aware:raw=1,recalibrate=0 \
    --json $out/compare_code_greedy.json

# The defaults at temperature 1.
draftsmith bench "${common[@]}" --temperature 1 --json $out/bench_t1.json

#!/usr/bin/env bash
# Issue 13's done-when figures on SmolLM2-135M (float32) with the code+chat EAGLE-3 head
# (runs/exp13/drafter: runs/exp11/mix/drafter calibrated on held-out stdlib continuations),
# every method side by side per prompt. Run on a quiet machine: bash benchmarks/policies/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=benchmarks/policies
drafter=artifact:runs/exp13/drafter
common=(--target smollm2-135m --drafter "$drafter" --dtype float32)

# The defaults (cost-aware, online recalibration), greedy and at temperature 1.
draftsmith bench "${common[@]}" --json $out/bench_greedy.json
draftsmith bench "${common[@]}" --temperature 1 --json $out/bench_t1.json

# Policies side by side on the bundled prompts (greedy): the best fixed lengths, today's
# hand-tuned flags, cost-aware on calibrated vs raw confidence, and the paper rules.
python scripts/compare_policies.py "${common[@]}" --prompts decoding/bench_prompts.jsonl \
    --max-new-tokens 64 \
    --policy fixed:max_draft_tokens=4 --policy fixed:max_draft_tokens=8 \
    --policy threshold:max_draft_tokens=12,min_path_confidence=0.4 \
    --policy cost-aware --policy cost-aware:raw=1,recalibrate=0 \
    --policy specdec++ --policy adaedl --policy cm-asd \
    --json $out/compare_greedy.json

# Sampling at top-p 0.9.
draftsmith bench "${common[@]}" --temperature 1 --top-p 0.9 --json $out/bench_t1_top_p.json

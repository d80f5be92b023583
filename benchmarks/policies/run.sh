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

# The defaults (cost-aware, online recalibration) on the bundled code / chat / prose: greedy,
# temperature 1, and temperature 1 with top-p 0.9.
draftsmith bench "${common[@]}" --json $out/bench_greedy.json
draftsmith bench "${common[@]}" --temperature 1 --json $out/bench_t1.json
draftsmith bench "${common[@]}" --temperature 1 --top-p 0.9 --json $out/bench_t1_top_p.json

# Every policy on the same bundled prompts: the best fixed lengths, today's hand-tuned flags,
# cost-aware on calibrated vs raw confidence and on the learned acceptance head (Platt-scaled,
# runs/exp13-acceptance/code-2: the same drafter), and the published stop rules.
python benchmarks/policies/compare_policies.py "${common[@]}" --prompts draftsmith/evaluation/bench_prompts.jsonl \
    --policy cost-aware --policy fixed:max_draft_tokens=2 --policy fixed:max_draft_tokens=4 \
    --policy fixed:max_draft_tokens=8 --policy threshold:max_draft_tokens=12,min_path_confidence=0.4 \
    --policy cost-aware:raw=1,recalibrate=0 \
    --policy cost-aware:artifact=runs/exp13-acceptance/code-2 \
    --policy cm-asd --policy specdec++ --policy adaedl \
    --json $out/compare_greedy.json

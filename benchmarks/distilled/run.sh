#!/usr/bin/env bash
# Issue 15's figures: Qwen2.5-Coder-0.5B distilled toward the 1.5B
# (recipes/qwen2.5-coder-1.5b/draft-model.yaml) against the undistilled 0.5B, greedy, side by side
# in one run (every bundled prompt decoded by plain generate, then by each draft and policy):
#   bash benchmarks/distilled/run.sh          # the recipe as written: bf16, the 1.5B's own words
#                                             # (about 80 minutes on a 2-core CPU with AMX)
#   CPU=1 bash benchmarks/distilled/run.sh    # a CPU without bf16 units (about 2 hours)
# CPU=1 runs float32 in one process on on-policy data alone (the 0.5B's samples continuing 96 chat
# and 48 stdlib training windows, scored by the 1.5B as it trains: DistillSpec's on-policy
# distillation), 160 steps of 256 tokens, 64 new tokens per bench prompt. Without it, ON_POLICY=1
# adds the 0.5B's samples to the 1.5B's regenerated data. Every step resumes or skips what is
# already written (regeneration resumes its jsonl, training its checkpoints).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=benchmarks/distilled
data=runs/data/qwen2.5-coder-1.5b
run=${RUN:-runs/qwen2.5-coder-1.5b-draft-model}
dtype=$([ "${CPU:-0}" = 1 ] && echo float32 || echo bfloat16)
writer=(--target qwen2.5-coder-1.5b --dtype $dtype --max-new-tokens 128 --batch-size 16)
on_policy=(--draft qwen2.5-coder-0.5b --sample --split train --prompts-per-document 2)

if [ "${CPU:-0}" = 1 ]; then
    draftsmith regenerate "${writer[@]}" "${on_policy[@]}" --source chitchat-transcripts \
        --max-records 96 --out $data/chitchat-train-onpolicy.jsonl
    draftsmith regenerate "${writer[@]}" "${on_policy[@]}" --source stdlib --max-records 48 \
        --out $data/stdlib-train-onpolicy.jsonl
    # Held-out evaluation on the raw held-out documents: the 1.5B's regenerated ones cost hours.
    draftsmith train recipes/qwen2.5-coder-1.5b/draft-model.yaml output_dir=$run \
        target_dtype=float32 mixed_precision=no \
        "data.source=[$data/chitchat-train-onpolicy.jsonl,$data/stdlib-train-onpolicy.jsonl]" \
        data.seq_len=256 "eval_data.source=[stdlib,chitchat-transcripts]" eval_data.seq_len=256 \
        max_steps=160 grad_accum=1 warmup_steps=8 eval_every=160 eval_batches=8 \
        checkpoint_every=40
    new_tokens=64
else
    for split in train heldout; do
        records=$([ $split = train ] && echo 320 || echo 32)
        draftsmith regenerate "${writer[@]}" --source stdlib --split $split \
            --max-records $records --prompts-per-document 2 \
            --out $data/stdlib-$split-continued.jsonl
        draftsmith regenerate "${writer[@]}" --source chitchat-transcripts --split $split \
            --max-records $((records / 2)) --prompts-per-document 2 \
            --out $data/chitchat-$split-continued.jsonl
        draftsmith regenerate "${writer[@]}" --source chitchat --split $split --max-turns 2 \
            --max-records $((records / 2)) --out $data/chitchat-$split-answers.jsonl
    done
    overrides=()
    if [ "${ON_POLICY:-0}" = 1 ]; then
        draftsmith regenerate "${writer[@]}" "${on_policy[@]}" --source stdlib \
            --max-records 320 --out $data/stdlib-train-onpolicy.jsonl
        sources=$data/stdlib-train-continued.jsonl,$data/chitchat-train-continued.jsonl
        sources=$sources,$data/chitchat-train-answers.jsonl,$data/stdlib-train-onpolicy.jsonl
        overrides=("data.source=[$sources]")
    fi
    accelerate launch --config_file recipes/accelerate/cpu-2proc.yaml scripts/train.py \
        recipes/qwen2.5-coder-1.5b/draft-model.yaml output_dir=$run "${overrides[@]}"
    new_tokens=64
fi
cp $run/metrics.jsonl $out/train_metrics_$dtype.jsonl

# The bundled prompts (8 held-out stdlib functions, 4 chat and 4 prose lines); both drafts under
# the default policy and at a fixed 8 tokens a round (the drafts alone, whatever they cost).
python benchmarks/policies/compare_policies.py --target qwen2.5-coder-1.5b --dtype $dtype \
    --drafter draft-model:qwen2.5-coder-0.5b --max-new-tokens $new_tokens \
    --prompts draftsmith/evaluation/bench_prompts.jsonl \
    --policy cost-aware --policy "cost-aware:artifact=$run/drafter" \
    --policy fixed:max_draft_tokens=8 --policy "fixed:max_draft_tokens=8,artifact=$run/drafter" \
    --json $out/compare_$dtype.json

"""How well a draft tree's node values predict what the target accepts given its parent was:

    python benchmarks/trees/tree_node_reliability.py --target NAME --drafter artifact:DIR \
        --prompts FILE.jsonl [--tree 8x3x24] [--max-new-tokens 64] [--temperature 1] \
        [--json OUT.json]

Greedy: every node of every drafted tree is scored against the target's argmax at its parent
(the target verifies every node, so each tells whether it would be accepted), by the rank of its
token among its parent's draft distribution q. Sampling (--temperature > 0, children drawn
without replacement): a node's label is the exact probability that multi-candidate verification
accepts it given its parent was accepted and given the drawn siblings (its elder siblings
rejected, each rejection leaving the residual of the target distribution p), and its rank is
its place in the draw.

Each node's conditional acceptance is predicted three ways from q and the calibrated acceptance
c of q's top-1 token, with q_r the r-th largest probability of q: raw q(token); `scaled`,
c * q_r / q_1 (what values tree nodes: greedy with r the token's rank, sampled with r its
place in the draw; siblings may sum past 1); and `rest`, c for rank 1 and the rest 1 - c
shared in proportion to q (1 - c) * q_r / (1 - q_1).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict

import torch

from draftsmith.build.drafters import build_drafter
from draftsmith.build.policies import parse_tree
from draftsmith.core.sampling import SamplingParams, probabilities
from draftsmith.core.signals import confidence_signals
from draftsmith.decoding import SpeculativeDecoder, build_policy
from draftsmith.evaluation.prompts import load_prompts
from draftsmith.zoo import load_model

VARIANTS = ("raw", "scaled", "rest")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--prompts", required=True)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tree", default="8,3,24", help="TOP_K,DEPTH,TOTAL of a fixed tree")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--json")
    args = parser.parse_args()
    sampling = SamplingParams(temperature=args.temperature)

    target, tokenizer = load_model(args.target, dtype=args.dtype)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    if built.acceptance is None:
        parser.error(f"{args.drafter} is not calibrated: the variants differ only with calibration")
    policy = build_policy(
        "fixed", tree=parse_tree(args.tree), acceptance=built.acceptance, recalibrate=False
    )
    decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
    # by rank: counts, accepted, and per variant the summed prediction and squared error
    ranks = defaultdict(lambda: defaultdict(float))

    def score(record) -> None:
        draft = record.draft
        if not len(draft):
            return
        depths, parents = draft.depths.tolist(), draft.parents.tolist()
        signals = confidence_signals(draft.logits.float())
        raw_path: list[float] = []
        for i, parent in enumerate(parents):
            raw_path.append(
                (1.0 if parent < 0 else raw_path[parent]) * float(signals["top1_prob"][i])
            )
        signals["position"] = torch.tensor(depths, dtype=torch.float) - 1
        signals["path_prob"] = torch.tensor(raw_path)
        calibrated = policy.acceptance_prob(signals).float()
        q = draft.logits.float().softmax(-1)
        labels = greedy_labels(record) if sampling.greedy else sampled_labels(record, sampling)
        for i, (rank, accepted) in enumerate(labels):
            token = int(draft.tokens[i])
            ranked = q[i].topk(rank).values
            q_rank, top1 = float(ranked[-1]), float(ranked[0])
            c = float(calibrated[i])
            predicted = {
                "raw": float(q[i, token]),
                "scaled": c * q_rank / top1,
                "rest": c if rank == 1 else (1 - c) * q_rank / (1 - top1),
            }
            row = ranks[rank]
            row["nodes"] += 1
            row["accepted"] += accepted
            for name, p in predicted.items():
                row[f"{name}_sum"] += p
                row[f"{name}_sq"] += (p - accepted) ** 2

    prompts = load_prompts(args.prompts, args.limit)
    for n, record in enumerate(prompts):
        ids = tokenizer(record["prompt"], return_tensors="pt").input_ids[0]
        decoder.generate(
            ids,
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            seed=args.seed + n,
            on_round=score,
        )

    table = {}
    for rank in sorted(ranks):
        row = ranks[rank]
        n = row["nodes"]
        table[rank] = {"nodes": int(n), "accepted": row["accepted"] / n} | {
            name: {"predicted": row[f"{name}_sum"] / n, "brier": row[f"{name}_sq"] / n}
            for name in VARIANTS
        }
    print(f"{'rank':>4} {'nodes':>6} {'accepted':>8} " + " ".join(f"{v:>8}" for v in VARIANTS))
    for rank, row in table.items():
        predicted = " ".join(f"{row[v]['predicted']:>8.3f}" for v in VARIANTS)
        print(f"{rank:>4} {row['nodes']:>6} {row['accepted']:>8.3f} {predicted}")
    later = [row for rank, row in table.items() if rank > 1]
    n_later = sum(row["nodes"] for row in later)
    summary = {
        name: {
            "brier_rank_2_on": sum(row[name]["brier"] * row["nodes"] for row in later) / n_later,
            "predicted_rank_2_on": sum(row[name]["predicted"] * row["nodes"] for row in later)
            / n_later,
        }
        for name in VARIANTS
    }
    accepted_later = sum(row["accepted"] * row["nodes"] for row in later) / n_later
    print(f"rank >= 2: {n_later} nodes, accepted {accepted_later:.3f}")
    for name, figures in summary.items():
        print(
            f"  {name:<7} predicted {figures['predicted_rank_2_on']:.3f}, "
            f"Brier {figures['brier_rank_2_on']:.4f}"
        )
    if args.json:
        report = {
            "command": " ".join(["python", *sys.argv]),
            "by_rank": table,
            "rank_2_on": {"nodes": n_later, "accepted": accepted_later} | summary,
        }
        with open(args.json, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")


def greedy_labels(record) -> list[tuple[int, float]]:
    """Per node (rank of its token in its parent's draft distribution, 1 if it is the target's
    argmax after its parent else 0)."""
    draft = record.draft
    q = draft.logits.float()
    target_next = record.target_logits.argmax(-1)
    labels = []
    for i, parent in enumerate(draft.parents.tolist()):
        token = int(draft.tokens[i])
        rank = int((q[i] > q[i, token]).sum()) + 1
        labels.append((rank, float(int(target_next[1 + parent]) == token)))
    return labels


def sampled_labels(record, sampling: SamplingParams) -> list[tuple[int, float]]:
    """Per node (its place among its siblings' draws, the probability that multi-candidate
    verification accepts it given its parent was): each child is accepted with probability
    min(1, p(x) / q(x)) against the residual p its rejected elder siblings left, as
    `verify_sampling` does."""
    draft = record.draft
    target = probabilities(record.target_logits, sampling)
    labels: dict[int, tuple[int, float]] = {}
    for parent in [-1, *range(len(draft))]:
        p, reach = target[parent + 1], 1.0
        for rank, child in enumerate(draft.children(parent), start=1):
            q = draft.probs[child]
            token = int(draft.tokens[child])
            accept = min(1.0, float(p[token]) / float(q[token]))
            labels[child] = (rank, reach * accept)
            reach *= 1.0 - accept
            residual = (p - q).clamp_min(0)
            if float(residual.sum()) <= 0:
                break
            p = residual / residual.sum()
    return [labels[i] for i in range(len(draft))]


if __name__ == "__main__":
    main()

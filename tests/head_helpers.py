"""Head-building helpers shared by the head, artifact, objective and calibration tests: every
kind at a tiny size, the batch the trainer would hand it, and a brief fit on the target's greedy
paths."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from conftest import greedy_reference

from draftsmith import heads
from draftsmith.core.target import Target, TargetBatch
from draftsmith.heads import DraftHead, build_draft_vocab

HEADS = {
    "medusa": ("medusa", {"num_steps": 4}),
    "medusa-reduced": ("medusa", {"num_steps": 3, "draft_vocab_size": 64}),
    "mtp": ("mtp", {"num_steps": 3}),
    "mtp-reduced": ("mtp", {"num_steps": 2, "draft_vocab_size": 64}),
    "eagle": ("eagle", {"num_steps": 2}),
    "eagle3": ("eagle3", {"num_steps": 3, "feature_layers": [0, 1, 2]}),
    "eagle3-reduced": ("eagle3", {"num_steps": 2, "draft_vocab_size": 64}),
    "peagle": ("peagle", {"num_steps": 3, "feature_layers": [0, 1, 2]}),
    "peagle-reduced": ("peagle", {"num_steps": 3, "draft_vocab_size": 64}),
    "dflash": ("dflash", {"num_steps": 3, "feature_layers": [0, 1, 2], "num_layers": 2}),
    "dflash-reduced": ("dflash", {"num_steps": 3, "draft_vocab_size": 64}),
    "dspark": (  # DFlash with DSpark's Markov and confidence heads
        "dflash",
        {"num_steps": 3, "draft_vocab_size": 64, "markov_rank": 8, "confidence_head": True},
    ),
    "distilled": ("distilled", {}),
    "distilled-lora": ("distilled", {"lora_rank": 4}),
}
REDUCED_VOCAB = 64
TRAIN_PROMPTS = [[5, 6, 7], [11, 3], [40, 41, 42, 43], [100]]


def build_head(name: str, target) -> DraftHead:
    """A fresh head of HEADS[name], bound to target."""
    kind, head_args = HEADS[name]
    return heads.build_head(kind, target, head_args)


def moved_head(kind: str, target, **args) -> DraftHead:
    """A head of `kind` with every weight moved off its initialisation (seeded), and a draft
    vocabulary of that many drafted ids when draft_vocab_size is given: what an export and its
    parity checks should carry over exactly."""
    head = heads.build_head(kind, target, args)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    if args.get("draft_vocab_size"):
        counts = torch.rand(target.config.vocab_size, generator=gen)
        head.set_draft_vocab(*build_draft_vocab(counts, args["draft_vocab_size"]))
    return head.eval()


def target_batch(target, head: DraftHead, input_ids: torch.Tensor) -> TargetBatch:
    """What the trainer hands a head: the target's logits and the features the head reads
    (every position trained on)."""
    features, logits, _ = Target(target, head.target_feature_layers).forward(input_ids)
    return TargetBatch(input_ids, torch.ones_like(input_ids, dtype=torch.bool), features, logits)


def training_ids(target, length: int = 32) -> torch.Tensor:
    """(4, length) the target's own greedy continuations of TRAIN_PROMPTS."""
    rows = [p + greedy_reference(target, torch.tensor(p), length - len(p)) for p in TRAIN_PROMPTS]
    return torch.tensor(rows)


def fit(head: DraftHead, target, steps: int = 60) -> DraftHead:
    """Train briefly on the target's greedy paths with hard labels under the alignment
    convention: step k at position t learns the target's argmax at t + k."""
    input_ids = training_ids(target)
    if head.draft_to_target() is not None:
        counts = torch.bincount(input_ids.flatten(), minlength=target.config.vocab_size)
        head.set_draft_vocab(*build_draft_vocab(counts, REDUCED_VOCAB))
    batch = target_batch(target, head, input_ids)
    labels = batch.target_logits.argmax(-1)
    if head.draft_to_target() is not None:
        labels = head.t2d[labels]  # -1 (ignored) outside the draft vocabulary
    optimizer = torch.optim.Adam([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    for _ in range(steps):
        loss = 0.0
        for k, logits in enumerate(head.forward_train(batch)):
            n = labels.shape[1] - 1 - k
            loss = loss + F.cross_entropy(
                logits[:, :n].flatten(0, 1), labels[:, k : k + n].flatten(), ignore_index=-1
            )
        if head.own_acceptance() is not None:  # a confidence head trains with its head
            loss = loss + head.auxiliary_loss()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval()

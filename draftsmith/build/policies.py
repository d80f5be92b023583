"""Draft policies from specs: a policy name, KEY=VALUE options and a tree spec, as the CLI,
the Python API, scripts and benchmarks give them."""

from __future__ import annotations

from typing import Literal

from transformers import PreTrainedModel

from draftsmith.build.cost_curve import cost_curve
from draftsmith.core.signals import AcceptanceModel
from draftsmith.decoding.policies import DEFAULT_POLICY, DraftPolicy, build_policy
from draftsmith.heads.base import TreeShape

AUTO_TREE = TreeShape(top_k=8, depth=8, total_tokens=64)
"""The most `--tree auto` drafts per round, before its cost curve cuts it; as deep as the
default policy's chains (`max_draft_tokens`), since the cost curve's stop rule sets the depth."""

TREE_FORMS = (
    "chain, auto or TOP_K,DEPTH,TOTAL[,EXPAND] (integers, e.g. 8,6,48, or 4,6,24,1 for a chain "
    "with 3 siblings a token)"
)


def parse_options(pairs: list[str]) -> dict[str, int | float | str]:
    """KEY=VALUE strings as a dict, numbers as numbers."""
    options: dict[str, int | float | str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(
                f"policy option {pair!r}: give KEY=VALUE, e.g. rejection_threshold=0.6"
            )
        for kind in (int, float):
            try:
                options[key] = kind(value)
                break
            except ValueError:
                continue
        else:
            options[key] = value
    return options


def parse_tree(spec: str) -> TreeShape | Literal["auto"] | None:
    """A tree spec: None for chain, "auto", or the TreeShape of TOP_K,DEPTH,TOTAL[,EXPAND]."""
    if spec in ("chain", "auto"):
        return None if spec == "chain" else "auto"
    try:
        parts = [int(part) for part in spec.split(",")]
        if len(parts) not in (3, 4):
            raise ValueError
        top_k, depth, total, *expand = parts
        return TreeShape(top_k, depth, total, expand[0] if expand else None)
    except ValueError as error:
        why = f" ({error})" if str(error) else ""
        raise ValueError(f"tree {spec!r}: give {TREE_FORMS}{why}") from None


def tree_options(spec: str | None, policy: str) -> dict:
    """The policy options a tree spec sets: `tree` (None: the policy's own draft), and for
    chain under the default policy, whose own draft is a sibling chain, no siblings."""
    tree = parse_tree(spec or "chain")
    options: dict = {"tree": AUTO_TREE if tree == "auto" else tree}
    if spec == "chain" and policy == DEFAULT_POLICY:
        options["siblings"] = 0
    return options


def split_policy_spec(spec: str) -> tuple[str, str | None, list[str]]:
    """NAME[:KEY=VALUE[:KEY=VALUE...]] as (name, the tree spec of a tree=... pair or None, the
    other KEY=VALUE pairs), e.g. ``fixed:tree=8,6,48:max_draft_tokens=4``. One spec names one
    policy wherever several run side by side."""
    name, *pairs = spec.split(":")
    trees = [pair.removeprefix("tree=") for pair in pairs if pair.startswith("tree=")]
    if len(trees) > 1:
        raise ValueError(f"policy spec {spec!r} gives tree= twice: give it once")
    if trees:
        parse_tree(trees[0])  # a bad tree fails here, naming its forms
    return name, (trees[0] if trees else None), [p for p in pairs if not p.startswith("tree=")]


def policy_from_spec(
    name: str = DEFAULT_POLICY,
    *,
    options: list[str] | None = None,
    tree: str | None = None,
    draft_tokens: int = 8,
    acceptance: AcceptanceModel | None = None,
    target: PreTrainedModel | None = None,
    target_name: str = "",
    rows: int = 1,
    **fields: int | float | str,
) -> DraftPolicy:
    """The policy `name` with its KEY=VALUE `options`, a tree spec (chain, auto or
    TOP_K,DEPTH,TOTAL[,EXPAND]; None: the policy's own draft), at most `draft_tokens` a chain,
    the drafter's `acceptance` model and, for the cost-aware policy given a `target`, the
    target's stored cost curve over `rows` rows (without a target: none yet, checked only).
    `fields` set policy fields directly (e.g. min_path_confidence)."""
    settings = {
        "max_draft_tokens": draft_tokens,
        **tree_options(tree, name),
        "acceptance": acceptance,
        **fields,
        **parse_options(options or []),
    }
    if name == DEFAULT_POLICY and target is not None:
        most = AUTO_TREE.max_tokens + 1  # one curve serves every tree up to auto's
        settings["cost"] = cost_curve(target, target_name, max_tokens=most, rows=rows)
    return build_policy(name, **settings)

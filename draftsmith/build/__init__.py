"""Specs to objects: drafters, the target's placement, draft policies and the cached cost
curve, shared by the Python API, the command line, scripts and benchmarks."""

from draftsmith.build.cost_curve import cost_curve
from draftsmith.build.drafters import BuiltDrafter, build_drafter, check_spec
from draftsmith.build.hf_generate import speculative_generate
from draftsmith.build.placement import TargetPlacement
from draftsmith.build.policies import (
    AUTO_TREE,
    parse_options,
    parse_tree,
    policy_from_spec,
    split_policy_spec,
    tree_options,
)

__all__ = [
    "AUTO_TREE",
    "BuiltDrafter",
    "TargetPlacement",
    "build_drafter",
    "check_spec",
    "cost_curve",
    "parse_options",
    "parse_tree",
    "policy_from_spec",
    "speculative_generate",
    "split_policy_spec",
    "tree_options",
]

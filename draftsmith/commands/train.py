"""``draftsmith train RECIPE.yaml [key=value ...]``: one training run from a YAML recipe."""

from __future__ import annotations

import argparse

from draftsmith.core.config import ConfigError, config_help
from draftsmith.train.config import TrainConfig, load_train_config
from draftsmith.train.trainer import TrainResult, train


def main(argv: list[str] | None = None, prog: str | None = None) -> TrainResult:
    """Command line of a training run: ``RECIPE.yaml [key=value ...]``; ``--help`` lists every
    config key with its docstring."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Train a drafter head on a frozen target from a YAML recipe. Overrides use "
        "the recipe's keys, dotted for nested ones (data.seq_len=256), values parsed as YAML "
        "(feature_cache=null).",
        epilog="config keys:\n" + config_help(TrainConfig),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", help="YAML recipe, e.g. recipes/smollm2-135m/eagle3.yaml")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides")
    args = parser.parse_args(argv)
    try:
        config = load_train_config(args.recipe, args.overrides)
    except ConfigError as error:
        parser.error(str(error))
    result = train(config)
    print(
        f"done: {result.steps} steps, {result.tokens_per_s:,.0f} tokens/s, held-out top-1 "
        f"{result.metrics['top1']}, tau_sim {result.metrics['tau_sim']}; drafter in "
        f"{result.artifact}"
    )
    return result

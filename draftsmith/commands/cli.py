"""The `draftsmith` command line: speculative-decoding drafters on a frozen target.

Each subcommand is a dataclass with a ``run()`` method (its fields are its flags, see
`draftsmith.build.flags`), imported only when chosen so ``draftsmith --help`` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import NoReturn

from draftsmith.build.flags import from_flags, parser_for

COMMANDS: dict[str, tuple[str, str]] = {
    "fetch-model": ("fetch:FetchModelCommand", "fetch a zoo model and print its folder"),
    "bench": (
        "bench:BenchCommand",
        "plain vs Hugging Face assisted vs draftsmith, side by side",
    ),
    "generate": (
        "generate:GenerateCommand",
        'decode one prompt with a drafter, streaming it: --target NAME --drafter SPEC "PROMPT" '
        "[--html OUT.html: a per-token view]",
    ),
    "train": (
        "train:TrainCommand",
        "train a drafter head in this process: RECIPE.yaml [key=value ...] (--help: all keys)",
    ),
    "plot-training": (
        "train:PlotTrainingCommand",
        "draw a training run's curve (loss, top-1, tau_sim per step) to a PNG: RUN_DIR",
    ),
    "prepare-data": (
        "data:PrepareDataCommand",
        "tokenize and pack a data source into training rows",
    ),
    "regenerate": (
        "data:RegenerateCommand",
        "data in the target's own words (the draft's with --draft: on-policy): --target NAME "
        "--source SRC --out FILE.jsonl",
    ),
    "calibrate": (
        "calibrate:CalibrateCommand",
        "calibrate an artifact's confidence (or --evaluate-only its calibration): ARTIFACT "
        "--target NAME --data FILE|SOURCE",
    ),
    "export": (
        "engines:ExportCommand",
        "write an artifact for vLLM / SGLang: ARTIFACT --format speculators|sglang|vllm-medusa",
    ),
    "import": (
        "engines:ImportCommand",
        "import a published EAGLE-3 / Medusa head: SOURCE --target NAME --out DIR",
    ),
    "profile": (
        "profile:ProfileCommand",
        "measure the target's verify cost for 1..N tokens on this device: --target NAME",
    ),
}
"""Subcommand -> (``module:Class`` under draftsmith.commands, one-line summary)."""


def _global_flags() -> argparse.ArgumentParser:
    """Flags taken before or after the subcommand's name."""
    flags = argparse.ArgumentParser(add_help=False)
    flags.add_argument("-v", "--verbose", action="store_true", help="log progress at INFO level")
    flags.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    return flags


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftsmith", description=__doc__.split("\n")[0], parents=[_global_flags()]
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        # Every word after the name, --help included, goes to the subcommand's own parser (no
        # prefix character marks an option here), built once the subcommand is chosen.
        sub = commands.add_parser(name, help=summary, add_help=False, prefix_chars="\0")
        sub.add_argument("arguments", nargs=argparse.REMAINDER)
    return parser


def command_class(name: str) -> type:
    """The dataclass of subcommand `name` (imports its module)."""
    module, _, cls = COMMANDS[name][0].partition(":")
    return getattr(importlib.import_module(f"draftsmith.commands.{module}"), cls)


def run_command(
    name: str,
    argv: list[str],
    *,
    prog: str | None = None,
    debug: bool = False,
    verbose: bool = False,
) -> object:
    """Parse `argv` into subcommand `name`'s dataclass and run it. An error it raises reaches
    the user as one line on stderr and exit status 2 (1 for an unexpected one), its traceback
    only with --debug (given here or in `argv`, as --verbose)."""
    prog = prog or f"draftsmith {name}"
    cls = command_class(name)
    parser = parser_for(cls, prog, parents=[_global_flags()], epilog=getattr(cls, "EPILOG", None))
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if verbose or args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s: %(message)s",
    )
    try:
        return from_flags(cls, args).run()
    except Exception as error:
        if debug or args.debug:
            raise
        _fail(prog, error)


def _fail(prog: str, error: Exception) -> NoReturn:
    # Imported here, on the way out: `draftsmith --help` need not pay for the zoo's imports.
    from draftsmith.zoo import ModelFetchError

    message = " ".join(str(error).split())  # one line, whatever the message's own layout
    if isinstance(error, (ValueError, OSError, ModelFetchError)):  # UnknownNameError included
        print(f"{prog}: error: {message}", file=sys.stderr)
        sys.exit(2)
    print(
        f"{prog}: error: unexpected {type(error).__name__}: {message} "
        "(rerun with --debug for the traceback, and please report it)",
        file=sys.stderr,
    )
    sys.exit(1)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    run_command(args.command, args.arguments, debug=args.debug, verbose=args.verbose)


if __name__ == "__main__":
    main()

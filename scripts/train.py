"""Train a drafter head on a frozen target from a recipe, in one process or many:

    accelerate launch [--config_file recipes/accelerate/NAME.yaml] scripts/train.py RECIPE.yaml [key=value ...]

``scripts/train.py --help`` lists every recipe key; an error is one line (``--debug``: traceback).
"""

import logging
import sys

from draftsmith.commands.cli import run_command

if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("draftsmith").setLevel(logging.INFO)
    run_command("train", sys.argv[1:], prog="scripts/train.py")

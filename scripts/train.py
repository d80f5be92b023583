"""Train a drafter head on a frozen target from a recipe, in one process or many (``draftsmith
train`` under ``accelerate launch``):

    accelerate launch [--config_file recipes/accelerate/NAME.yaml] scripts/train.py RECIPE.yaml [key=value ...]

``scripts/train.py --help`` lists every recipe key; an error is one line (``--debug``: traceback).
"""

import logging
import sys

from draftsmith.commands.cli import main

if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("draftsmith").setLevel(logging.INFO)
    main(["train", *sys.argv[1:]])

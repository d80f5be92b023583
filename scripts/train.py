"""Train a drafter head on a frozen target from a recipe, in one process or many:

    accelerate launch [--config_file recipes/accelerate/NAME.yaml] scripts/train.py RECIPE.yaml [key=value ...]

``scripts/train.py --help`` lists every recipe key.
"""

import logging

from draftsmith.commands.train import main

if __name__ == "__main__":
    logging.basicConfig(format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("draftsmith").setLevel(logging.INFO)
    main()

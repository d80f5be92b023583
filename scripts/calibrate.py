"""Calibrate a drafter artifact's confidence on held-out data.

python scripts/calibrate.py runs/quickstart/drafter --target smollm2-135m --data stdlib
"""

import argparse

from draftsmith.commands.calibrate import add_calibrate_arguments, run_calibrate

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    add_calibrate_arguments(parser)
    run_calibrate(parser.parse_args())

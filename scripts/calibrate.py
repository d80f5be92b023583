"""Calibrate a drafter artifact's confidence on held-out data (as ``draftsmith calibrate``):

python scripts/calibrate.py runs/quickstart/drafter --target smollm2-135m --data stdlib
"""

import sys

from draftsmith.commands.cli import run_command

if __name__ == "__main__":
    run_command("calibrate", sys.argv[1:], prog="scripts/calibrate.py")

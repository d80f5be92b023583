#!/usr/bin/env bash
# The separate environment of the speculators parity tests (tests/test_speculators_parity.py):
# speculators 0.9.0 pins transformers <= 5.19 and datasets <= 5.1, older than draftsmith's.
#
#   bash scripts/speculators_env.sh [VENV]      (default .venv-speculators; ~3 minutes)
#   SPECULATORS_PYTHON=VENV/bin/python python -m pytest -m slow tests/test_speculators_parity.py
set -euo pipefail
venv="${1:-.venv-speculators}"
python3.11 -m venv "$venv"
# The CPU torch first, and held there: speculators' own range would pull a multi-GB CUDA build.
"$venv/bin/pip" install --quiet torch==2.13.0
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
"$venv/bin/pip" freeze | grep -i '^torch==' > "$constraints"
"$venv/bin/pip" install --quiet -c "$constraints" speculators==0.9.0
# speculators requires torchvision / torchaudio but never imports them, and the only builds on
# the registry are CUDA ones, whose import (through transformers) fails on this CPU machine.
"$venv/bin/pip" uninstall --quiet -y torchvision torchaudio
HF_HUB_OFFLINE=1 "$venv/bin/python" -c "import speculators.models.eagle3; print('speculators ready')"

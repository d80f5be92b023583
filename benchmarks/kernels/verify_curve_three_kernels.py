"""The target's verification cost with three linear kernels (`weight_first.KERNELS`: stock torch,
draftsmith 0.3.1's weight-first product, 0.3.2's oneDNN on packed weights), alternated in one
run, per size the fastest of all rounds (`benchmarks/kernels/verify_curve_ab.py` with a third kernel).

    python benchmarks/kernels/verify_curve_three_kernels.py TARGET DTYPE ROUNDS MAX_TOKENS OUT.json
"""

import sys
from pathlib import Path

from weight_first import KERNELS, use_kernel

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from verify_curve_ab import compare_kernels  # noqa: E402

compare_kernels(KERNELS, use_kernel)

"""ms per linear call over a few rows, `F.linear` against oneDNN on the prepacked weight
(`draftsmith.core.small_rows`), on a ring
of distinct weights (about 250 MB, so each is read from memory, as in a forward), fastest of 5.

    python benchmarks/kernels/linear_ring_bench.py [THREADS]
"""

import sys
import time

import torch
import torch.nn.functional as F

SHAPES = [(576, 1536), (1536, 576), (1536, 8960), (8960, 1536), (576, 49152)]
ROWS = [1, 2, 4, 8, 16, 32, 64]


def per_call_ms(weights: list[torch.Tensor], op, rows: int, repeats: int = 5) -> float:
    x = torch.randn(rows, weights[0].shape[1])
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for weight in weights:
            op(x, weight)
        best = min(best, time.perf_counter() - start)
    return best / len(weights) * 1e3


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print("weight (K x N)  " + "  ".join(f"{r:>4} rows linear / packed" for r in ROWS))
    for k, n in SHAPES:
        weights = [torch.randn(n, k) for _ in range(max(2, int(250e6 / (k * n * 4))))]
        packed = [torch.ops.mkldnn._reorder_linear_weight(w) for w in weights]
        cells = []
        for rows in ROWS:
            stock = per_call_ms(weights, F.linear, rows)
            ours = per_call_ms(
                packed,
                lambda x, w: torch.ops.mkldnn._linear_pointwise(x, w, None, "none", [], ""),
                rows,
            )
            cells.append(f"{stock:8.2f} / {ours:6.2f}")
        print(f"{k:5d} x {n:5d}   " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()

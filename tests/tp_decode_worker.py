"""One rank of the tensor-parallel decoding test (tests/test_parallel_target.py), run by torchrun:

    torchrun --nproc_per_node 2 tests/tp_decode_worker.py TARGET_DIR OUT_DIR

Loads the target sharded over the processes (transformers' tp_plan="auto") and decodes the
test's cases; each rank writes OUT_DIR/rank-R.json with the tokens and drafting stats, and
what `shards_agree` makes of timings that differ by rank.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from draftsmith.core.parallel import shards_agree, tensor_parallel_world_size
from draftsmith.zoo import load_model

sys.path.insert(0, str(Path(__file__).parent))
from parallel_cases import decode_cases  # noqa: E402


def main(target_dir: str, out_dir: str) -> None:
    target, _ = load_model(target_dir, dtype="float32", tensor_parallel=True)
    torch.set_num_threads(1)  # conftest asks for two; torchrun gives each rank one core
    reference, _ = load_model(target_dir, dtype="float32")
    rank = torch.distributed.get_rank()
    results = decode_cases(target, reference)
    results["world_size"] = tensor_parallel_world_size()
    results["sharded"] = type(target.model.layers[0].self_attn.q_proj.weight).__name__
    results["agreed"] = shards_agree(target, [rank, 1 - rank])
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(results))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])

"""Write the standard suite's prompts, rendered for one target, as prompt records
({"prompt", "workload", "id"}) that `draftsmith calibrate --evaluate-only --data FILE` and
`stream_calibration.py --prompts FILE` decode: the suite's chat prompts are turn lists, which
those read only once rendered with the target's chat template (`evaluation.suite.bench_prompts`,
what `draftsmith bench --suite` decodes).

    python benchmarks/calibration/suite_prompt_records.py --target smollm2-135m --out FILE
"""

from __future__ import annotations

import argparse
import json

from transformers import AutoTokenizer

from draftsmith.evaluation.suite import bench_prompts, load_suite
from draftsmith.zoo import resolve_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, help="zoo name or local folder")
    parser.add_argument("--suite", default="standard")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(args.target))
    records = bench_prompts(load_suite(args.suite), tokenizer)
    with open(args.out, "w") as out:
        out.writelines(json.dumps(r) + "\n" for r in records)
    print(f"wrote {len(records)} prompts to {args.out}")


if __name__ == "__main__":
    main()

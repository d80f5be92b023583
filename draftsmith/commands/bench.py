"""``draftsmith bench``: plain `generate`, Hugging Face assisted generation and draftsmith, side by
side on the same loaded models."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

from draftsmith.core.models import Dtype

BUNDLED_PROMPTS = "bench_prompts.jsonl"


def bundled_prompts() -> Path:
    """The prompt set shipped with the package (code, chat and prose)."""
    return Path(str(resources.files("draftsmith.decoding") / BUNDLED_PROMPTS))


@dataclass(kw_only=True)
class BenchCommand:
    """Benchmark a drafter against plain and Hugging Face assisted generation: every prompt runs
    all three back to back after a warm-up; speed is reported as ratios, with the mean accepted
    length and every divergence from the target's plain greedy output."""

    target: str
    """Zoo name, local folder or hub id of the target model."""
    drafter: str
    """The drafter: draft-model:NAME_OR_PATH, ngram[:MAX_N] or artifact:PATH."""
    prompts: Path = field(default_factory=bundled_prompts)
    """jsonl of {"prompt": str, "workload": str (optional)} records."""
    max_new_tokens: int = 128
    """Tokens generated after each prompt."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy."""
    limit: int | None = None
    """Use the first N prompts; None: all."""
    dtype: Dtype = "auto"
    """Precision of the target and draft model (auto: the checkpoint's own)."""
    draft_tokens: int = 8
    """Most tokens drafted per round."""
    min_path_confidence: float = 0.0
    """Stop a draft once its cumulative acceptance probability (calibrated when the artifact has
    a calibration, else the raw top-1 probabilities) falls below this; 0: never stop early."""
    seed: int = 0
    """Seeds sampling (each prompt and method starts from it)."""
    json: Path | None = None
    """Write the report here as JSON."""

    def run(self) -> dict:
        import torch

        from draftsmith.commands.drafter_spec import build_drafter, check_spec
        from draftsmith.core.models import load_model
        from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder
        from draftsmith.decoding.benchmark import (
            Benchmark,
            format_divergence,
            format_table,
            load_prompts,
        )

        prompts = load_prompts(self.prompts, self.limit)
        check_spec(self.drafter)  # a bad drafter fails before the target loads
        target, tokenizer = load_model(self.target, dtype=self.dtype)
        built = build_drafter(self.drafter, target, tokenizer, dtype=self.dtype)
        policy = DraftLengthPolicy(
            max_draft_tokens=self.draft_tokens,
            min_path_confidence=self.min_path_confidence,
            acceptance=built.acceptance,
        )
        decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
        bench = Benchmark(
            target,
            tokenizer,
            decoder,
            built.hf_assist,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            seed=self.seed,
        )
        report = bench.run(prompts)
        report["config"] = {
            **{k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()},
            "torch_threads": torch.get_num_threads(),
            "command": " ".join(["draftsmith", *sys.argv[1:]]),
        }
        print(format_table(report))
        for d in report["overall"]["divergences"]:
            print(format_divergence(d))
        if self.json:
            self.json.parent.mkdir(parents=True, exist_ok=True)
            self.json.write_text(json.dumps(report, indent=2) + "\n")
            print(f"wrote {self.json}")
        return report

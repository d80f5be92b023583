"""``draftsmith generate``: one prompt decoded speculatively, streamed to the terminal as rounds
commit it, with its figures and, on request, a per-token HTML view of what the drafter did."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from draftsmith.build.flags import POSITIONAL, SAMPLING_RANGES, Range
from draftsmith.build.policies import split_policy_spec
from draftsmith.core.models import Dtype
from draftsmith.decoding.policies import DEFAULT_POLICY, POLICIES, CostAwarePolicy


@dataclass(kw_only=True)
class GenerateCommand:
    """Generate after a prompt with a drafter, printing the text as each round commits it, then
    tokens/s, the mean accepted length and an estimated speedup over plain decoding. --html
    writes a page of the output with each token coloured by how it was produced (accepted draft
    token and its draft position, the target's correction or bonus token, plain step) and the
    drafter's confidence on hover."""

    FLAG_RANGES: ClassVar[dict[str, Range]] = {
        **SAMPLING_RANGES,
    }

    prompt: str = field(metadata=POSITIONAL)
    """The prompt text (quoted)."""
    target: str
    """Zoo name, local folder or hub id of the target model."""
    drafter: str
    """The drafter: draft-model:NAME_OR_PATH, ngram[:MAX_N], artifact:PATH, or route:SPEC+SPEC
    (a router picking one of several, e.g. route:artifact:PATH+ngram)."""
    chat: bool = False
    """Send the prompt as a user turn through the target's chat template (ending where the
    assistant answers)."""
    max_new_tokens: int = 128
    """Most tokens generated after the prompt (fewer where an EOS token comes first)."""
    temperature: float = 0.0
    """Sampling temperature; 0 is greedy."""
    top_p: float | None = None
    """Sample from the smallest set of tokens holding this probability (with --temperature)."""
    top_k: int | None = None
    """Sample from the k most likely tokens (with --temperature)."""
    seed: int = 0
    """Seeds sampling."""
    dtype: Dtype = "auto"
    """Precision of the target and draft model (auto: bfloat16 on a GPU and on a CPU with bf16
    matrix units, AMX or AVX512-BF16; float32 elsewhere)."""
    policy: str = DEFAULT_POLICY
    """How much to draft each round, as for `draftsmith bench`: cost-aware (the target's measured
    verification cost against the drafter's calibrated acceptance), fixed, threshold, cm-asd,
    specdec++ or adaedl; a spec NAME[:KEY=VALUE:...] gives its options."""
    html: Path | None = None
    """Also write the per-token view here (a self-contained HTML page)."""

    def __post_init__(self) -> None:
        name, _, _ = split_policy_spec(self.policy)  # a spec, as bench takes: NAME[:KEY=VALUE]
        if name not in POLICIES:
            raise ValueError(f"unknown --policy {name!r}: choose one of {sorted(POLICIES)}")

    def run(self) -> dict:
        import time

        import torch
        from transformers import TextStreamer

        from draftsmith.build import AUTO_TREE, build_drafter, check_spec, cost_curve
        from draftsmith.build.policies import policy_from_spec
        from draftsmith.decoding import SpeculativeDecoder
        from draftsmith.evaluation.suite import render_prompt
        from draftsmith.evaluation.token_view import RoundLog, summary_line, write_token_view
        from draftsmith.zoo import load_model

        check_spec(self.drafter)  # a bad drafter fails before the target loads
        target, tokenizer = load_model(self.target, dtype=self.dtype)
        built = build_drafter(self.drafter, target, tokenizer, dtype=self.dtype)
        policy = policy_from_spec(
            self.policy, acceptance=built.acceptance, target=target, target_name=self.target
        )
        decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
        # Plain decoding's step, for the speedup estimate: the cost-aware policy times it on this
        # run's rounds; with another policy, the stored cost curve gives it (measured now where
        # there is none, before the output streams).
        curve = None
        if not isinstance(policy, CostAwarePolicy):
            curve = cost_curve(target, self.target, max_tokens=AUTO_TREE.max_tokens + 1)
        turn = {"prompt": [{"role": "user", "content": self.prompt}]}
        prompt = render_prompt(turn, tokenizer) if self.chat else self.prompt
        log = RoundLog(built.acceptance) if self.html else None
        streamer = TextStreamer(tokenizer, skip_special_tokens=True)
        commits: list[tuple[float, int]] = []  # (when, how many tokens) of each round

        def commit(_: int, tokens: list[int]) -> None:
            streamer.put(torch.tensor(tokens))
            commits.append((time.perf_counter(), len(tokens)))

        result = decoder.generate(
            prompt,
            self.max_new_tokens,
            temperature=self.temperature,
            top_k=self.top_k,
            top_p=self.top_p,
            seed=self.seed,
            on_round=log,
            on_commit=commit,
        )
        streamer.end()
        later = sum(n for _, n in commits[1:])
        if curve is None:
            plain_token_s, source = (
                1.0 / policy.plain_rate(),
                "by the cost curve, scaled to the run",
            )
        else:
            plain_token_s, source = curve.verify_cost(1), "by the stored cost curve"
        summary = summary_line(
            result.stats, plain_token_s, later, commits[-1][0] - commits[0][0], source
        )
        print(summary)
        if log is not None:
            write_token_view(
                self.html,
                log.origins(result.tokens),
                tokenizer,
                prompt=prompt,
                calibrated=log.calibrated,
                heading=f"{self.target} with {self.drafter}",
                summary=summary,
            )
            print(f"wrote {self.html}")
        return {"tokens": result.tokens, "text": result.text, "stats": result.stats.to_dict()}

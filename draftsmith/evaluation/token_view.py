"""Where each output token of a speculative generation came from, as a self-contained HTML page:
a drafted token the target accepted (and at which draft position), the target's correction where
it rejected the draft, its bonus token after a draft it accepted whole, or a plain step where
nothing was drafted; the drafter's confidence on hover.

    log = RoundLog(built.acceptance)
    result = decoder.generate(prompt, on_round=log)
    write_token_view(path, log.origins(result.tokens), tokenizer, ...)
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from draftsmith.core.signals import AcceptanceModel
from draftsmith.decoding.online import draft_signals
from draftsmith.decoding.results import GenerationStats, RoundRecord

KINDS = ("accepted", "correction", "bonus", "plain")
"""How a token was produced; each is its span's CSS class in the page."""

LEGEND = {
    "accepted": "drafted, accepted (darker: deeper in the draft)",
    "correction": "the target's token where it rejected the draft",
    "bonus": "the target's token after a draft it accepted whole",
    "plain": "a plain step: nothing drafted",
}


@dataclass(frozen=True)
class TokenOrigin:
    """How one output token was produced."""

    token: int
    kind: str
    """One of `KINDS`."""
    round: int
    """The round (target forward) that committed it, from 0."""
    position: int | None = None
    """accepted: its 1-based depth in the round's draft."""
    confidence: float | None = None
    """The drafter's confidence in this token (accepted) or in the drafted token rejected here
    (correction): the calibrated P(accept), or the raw top-1 probability without a
    calibration; None where the draft has no distribution (n-gram)."""
    rejected: int | None = None
    """correction: the drafted token the target rejected here (in a tree, the first child)."""


@dataclass(frozen=True)
class _Round:
    """What the view keeps of one round: the draft's tokens (k,) and parents (k,) as lists, the
    accepted path and each node's confidence (None without a draft distribution)."""

    tokens: list[int]
    parents: list[int]
    path: list[int]
    confidence: list[float] | None


class RoundLog:
    """An `on_round` hook for one prompt's generation that keeps each round's draft, accepted
    path and, computed then, the drafter's confidence in every drafted token: `acceptance` (the
    artifact's calibration) where given, else the raw top-1 probability. Computed during the
    round because a learned acceptance head finds the states it reads among the drafter's
    latest."""

    def __init__(self, acceptance: AcceptanceModel | None = None) -> None:
        self.acceptance = acceptance
        self.rounds: list[_Round] = []

    @property
    def calibrated(self) -> bool:
        return self.acceptance is not None

    def __call__(self, record: RoundRecord) -> None:
        draft = record.draft
        confidence = None
        if len(draft) and (draft.logits is not None or draft.signals is not None):
            signals = draft_signals(draft)
            scores = (
                signals["top1_prob"]
                if self.acceptance is None
                else self.acceptance.predict_signals(signals)
            )
            confidence = scores.float().cpu().tolist()
        self.rounds.append(
            _Round(
                draft.tokens.tolist(),
                draft.parents.tolist(),
                list(record.accepted_path),
                confidence,
            )
        )

    def origins(self, tokens: list[int]) -> list[TokenOrigin]:
        """The origin of each output token (the generation's `tokens`, which its rounds
        committed in order, cut at the end); a ValueError when the rounds drafted other tokens
        than those."""
        origins: list[TokenOrigin] = []
        for index, r in enumerate(self.rounds):
            for depth, node in enumerate(r.path, start=1):
                score = None if r.confidence is None else r.confidence[node]
                origins.append(TokenOrigin(r.tokens[node], "accepted", index, depth, score))
            last = r.path[-1] if r.path else -1
            children = [node for node, parent in enumerate(r.parents) if parent == last]
            committed = len(origins)
            token = tokens[committed] if committed < len(tokens) else -1
            if not r.tokens:
                origins.append(TokenOrigin(token, "plain", index))
            elif not children:
                origins.append(TokenOrigin(token, "bonus", index))
            else:
                child = children[0]
                score = None if r.confidence is None else r.confidence[child]
                origins.append(
                    TokenOrigin(token, "correction", index, None, score, r.tokens[child])
                )
        if len(origins) < len(tokens) or [o.token for o in origins[: len(tokens)]] != tokens:
            raise ValueError("these rounds did not commit these tokens: log one generation")
        return origins[: len(tokens)]


def summary_line(
    stats: GenerationStats, plain_token_s: float, later_tokens: int, later_s: float, source: str
) -> str:
    """The run's figures: tokens, time, tokens/s, mean accepted length and an estimated speedup
    over plain decoding: the tokens/s of the rounds after the first (`later_tokens` committed in
    `later_s` seconds; the first round, with the prompt's prefill and what warms up, would weigh
    on a short run) against plain decoding's, taken as one target forward of `plain_token_s`
    seconds a token, as `source` says it was found (plain decoding's own overhead around each
    forward is left out, so on a small model the estimate runs low). Not a measurement."""
    figures = (
        f"{stats.new_tokens} tokens in {stats.wall_s:.2f} s: {stats.tokens_per_s:.1f} tokens/s, "
        f"mean accepted length (tau) {stats.mean_accepted_length:.2f}"
    )
    if later_tokens == 0 or later_s <= 0:
        return f"{figures}; one round only: too short to estimate a speedup"
    rate = later_tokens / later_s
    return (
        f"{figures}; estimated speedup {rate * plain_token_s:.2f}x over plain decoding "
        f"(an estimate: {rate:.1f} tokens/s after the first round against plain decoding taken as "
        f"one target forward a token, {plain_token_s * 1e3:.1f} ms {source}; "
        "`draftsmith bench` measures both side by side)"
    )


def token_texts(tokenizer: PreTrainedTokenizerBase, tokens: list[int]) -> list[str]:
    """Each token's share of the decoded text of `tokens` (decoding the whole and taking what
    each token adds keeps the spaces a tokenizer attaches to word starts; a byte a character
    needs more of shows as the replacement character until the token that completes it)."""
    texts, before = [], ""
    for end in range(1, len(tokens) + 1):
        now = tokenizer.decode(tokens[:end])
        shared = len(os.path.commonprefix([before, now]))
        texts.append(now[shared:])
        before = now
    return texts


def _title(origin: TokenOrigin, tokenizer: PreTrainedTokenizerBase, calibrated: bool) -> str:
    """The hover text of a token's span."""
    what = "calibrated P(accept)" if calibrated else "raw top-1 probability (uncalibrated)"
    score = "" if origin.confidence is None else f"; {what} {origin.confidence:.3f}"
    if origin.kind == "accepted":
        said = f"drafted at position {origin.position}, accepted{score}"
    elif origin.kind == "correction":
        drafted = tokenizer.decode([origin.rejected])
        said = f"the target's correction: the draft proposed {drafted!r}{score}"
    elif origin.kind == "bonus":
        said = "the target's bonus token: it accepted the whole draft"
    else:
        said = "plain step: nothing was drafted"
    return f"round {origin.round}: {said} (token id {origin.token})"


STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; max-width: 60em; }
.text { font-family: ui-monospace, monospace; white-space: pre-wrap; line-height: 1.7; }
.prompt { color: #777; }
.tok { border-radius: 3px; }
.accepted { background: hsl(130, 55%, calc(max(50%, 88% - var(--position) * 6%))); }
.correction { background: #f4a6a0; }
.bonus { background: #a8c8f4; }
.plain { background: #e4e4e4; }
.legend span { margin-right: 1.5em; padding: 0 0.4em; }
"""


def write_token_view(
    path: str | os.PathLike,
    origins: list[TokenOrigin],
    tokenizer: PreTrainedTokenizerBase,
    *,
    prompt: str,
    calibrated: bool,
    heading: str,
    summary: str,
) -> Path:
    """Write the page: `heading`, `summary` (the run's figures), a legend, then the prompt and
    each output token as a span of class "tok KIND" (accepted ones with their draft position as
    `--position`), its origin and the drafter's confidence in its title."""
    spans = []
    for origin, text in zip(
        origins, token_texts(tokenizer, [o.token for o in origins]), strict=True
    ):
        style = f' style="--position: {origin.position}"' if origin.position else ""
        title = html.escape(_title(origin, tokenizer, calibrated))
        spans.append(
            f'<span class="tok {origin.kind}" data-round="{origin.round}"{style} '
            f'title="{title}">{html.escape(text)}</span>'
        )
    confidence = "the artifact's calibrated P(accept)" if calibrated else "raw top-1 probability"
    first = ' style="--position: 1"'
    legend = "".join(
        f'<span class="{kind}"{first if kind == "accepted" else ""}>{html.escape(said)}</span>'
        for kind, said in LEGEND.items()
    )
    page = f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(heading)}</title>
<style>{STYLE}</style></head>
<body><h1>{html.escape(heading)}</h1>
<p>{html.escape(summary)}</p>
<p class="legend">{legend}</p>
<p>Hover a token for its origin and the drafter's confidence ({confidence}).</p>
<div class="text"><span class="prompt">{html.escape(prompt)}</span>{"".join(spans)}</div>
</body></html>
"""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(page, encoding="utf-8")
    partial.replace(path)
    return path

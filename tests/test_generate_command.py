"""`draftsmith generate`: the text streamed, the run's figures, and the per-token HTML view whose
every token's class matches the decoder's round records (read with the stdlib's HTML parser)."""

from __future__ import annotations

from html.parser import HTMLParser

import numpy as np
import pytest
import torch
from conftest import tiny_model
from head_helpers import build_head, fit

from draftsmith import SpeculativeDecoder
from draftsmith.artifact import save_artifact
from draftsmith.calibration import build_calibrator
from draftsmith.commands.cli import main
from draftsmith.core.sampling import SamplingParams
from draftsmith.decoding import GenerationStats, RoundRecord
from draftsmith.evaluation.token_view import RoundLog, summary_line
from draftsmith.heads import Draft

PROMPT = "def f(x):"


@pytest.fixture(scope="module")
def saved(tmp_path_factory, byte_tokenizer):
    """A tiny target with its tokenizer, the same model as a draft model (it accepts every
    draft), and a briefly trained Medusa artifact with a Platt calibration on top1_prob."""
    root = tmp_path_factory.mktemp("saved")
    target = tiny_model("llama", seed=0)
    target.save_pretrained(root / "target")
    byte_tokenizer.save_pretrained(root / "target")
    head = fit(build_head("medusa", target), target, steps=20)
    save_artifact(head, target, root / "medusa", training={"steps": 20}, target_name_or_path="t")
    platt = build_calibrator("platt", ("top1_prob",))
    top1 = np.linspace(0.05, 0.95, 40)
    platt.fit(top1, (top1 > 0.5) ^ (np.arange(40) % 5 == 0))  # accepted mostly when confident
    platt.save(root / "medusa")
    return root


class Spans(HTMLParser):
    """Each token span of the page: (its classes, its attributes, its text)."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[tuple[list[str], dict, str]] = []
        self._open: tuple[list[str], dict] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        classes = (attrs.get("class") or "").split()
        if tag == "span" and "tok" in classes:
            self._open = (classes, attrs)
            self.spans.append((classes, attrs, ""))

    def handle_data(self, data):
        if self._open is not None:
            classes, attrs, text = self.spans[-1]
            self.spans[-1] = (classes, attrs, text + data)

    def handle_endtag(self, tag):
        if tag == "span":
            self._open = None


def expected_kinds(records, n_tokens: int) -> list[tuple[str, int | None]]:
    """(kind, draft position) of each output token, read from the round records alone."""
    kinds = []
    for record in records:
        path = record.accepted_path
        kinds += [("accepted", depth) for depth in range(1, len(path) + 1)]
        parents = record.draft.parents.tolist()
        last = path[-1] if path else -1
        if len(record.draft) == 0:
            kinds.append(("plain", None))
        elif last in parents:
            kinds.append(("correction", None))
        else:
            kinds.append(("bonus", None))
    return kinds[:n_tokens]


@pytest.mark.parametrize(
    "drafter, policy, seen",
    [
        ("artifact:{root}/medusa", "fixed", {"accepted", "correction"}),
        ("draft-model:{root}/target", "fixed", {"accepted", "bonus"}),
        ("ngram", "cost-aware", {"plain"}),
    ],
)
def test_the_html_view_colours_each_token_as_the_rounds_produced_it(
    drafter, policy, seen, saved, tmp_path, monkeypatch, capsys, byte_tokenizer
):
    records, results = [], []
    generate_batch = SpeculativeDecoder.generate_batch

    def spy(self, prompts, max_new_tokens=128, **options):
        hook = options["on_round"]

        def both(record):
            records.append(record)
            hook(record)

        results.extend(
            generate_batch(self, prompts, max_new_tokens, **{**options, "on_round": both})
        )
        return results

    monkeypatch.setattr(SpeculativeDecoder, "generate_batch", spy)
    page = tmp_path / "view.html"
    drafter = drafter.format(root=saved)
    main(
        ["generate", "--target", str(saved / "target"), "--drafter", drafter, "--policy", policy]
        + ["--max-new-tokens", "40", "--html", str(page), PROMPT]
    )
    tokens = results[0].tokens
    text = byte_tokenizer.decode(tokens)
    printed = capsys.readouterr().out
    assert f"{text}\n{len(tokens)} tokens in " in printed  # streamed, then the figures
    assert "tokens/s" in printed and "mean accepted length (tau)" in printed
    assert "estimated speedup" in printed and f"wrote {page}" in printed

    parser = Spans()
    parser.feed(page.read_text())
    spans = parser.spans
    assert "".join(span_text for _, _, span_text in spans) == text
    got = []
    for classes, attrs, _ in spans:
        kind = next(k for k in classes if k != "tok")
        position = attrs.get("style", "").removeprefix("--position: ")
        got.append((kind, int(position) if position else None))
    assert got == expected_kinds(records, len(tokens))
    assert seen <= {kind for kind, _ in got}
    for (kind, _), (_, attrs, _) in zip(got, spans, strict=True):
        title = attrs["title"]
        if kind == "accepted" and drafter.startswith("artifact"):
            assert "calibrated P(accept)" in title
        if kind == "accepted" and drafter.startswith("draft-model"):
            assert "raw top-1 probability (uncalibrated)" in title
        if kind == "plain":
            assert "nothing was drafted" in title and "probability" not in title


def test_the_speedup_estimate_is_the_later_rounds_rate_against_the_cost_curves():
    stats = GenerationStats()
    stats.target_forwards = 4
    stats.finish(new_tokens=10, wall_s=0.5)
    line = summary_line(stats, 0.1, later_tokens=8, later_s=0.2, source="by the curve")
    assert "10 tokens in 0.50 s: 20.0 tokens/s" in line
    assert "mean accepted length (tau) 2.50" in line
    assert "estimated speedup 4.00x" in line and "40.0 tokens/s after the first round" in line
    assert "one target forward a token, 100.0 ms by the curve" in line
    short = summary_line(stats, 0.1, later_tokens=0, later_s=0.0, source="by the curve")
    assert "too short to estimate a speedup" in short and "estimated speedup" not in short


def test_a_bad_policy_fails_before_any_model_loads(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--target", "unused", "--drafter", "ngram", "--policy", "magic", "hi"])
    assert "unknown --policy 'magic'" in capsys.readouterr().err


def test_chat_sends_the_prompt_through_the_chat_template(saved, monkeypatch):
    prompts = []

    def record(self, prompts_, max_new_tokens=128, **options):
        prompts.extend(prompts_)
        raise ValueError("stop here")

    monkeypatch.setattr(SpeculativeDecoder, "generate_batch", record)
    with pytest.raises(SystemExit):
        main(["generate", "--target", str(saved / "target"), "--drafter", "ngram", "--chat", "hi"])
    assert prompts == ["User: hi\nAssistant:"]  # the tiny tokenizer has no template: a transcript


def test_the_view_of_tokens_the_rounds_did_not_commit_is_an_error():
    log = RoundLog()
    draft = Draft(tokens=torch.tensor([7, 8]))
    log(RoundRecord(draft, torch.zeros(3, 16), [0], SamplingParams()))
    assert [o.kind for o in log.origins([7, 9])] == ["accepted", "correction"]
    with pytest.raises(ValueError, match="did not commit these tokens"):
        log.origins([6, 9])

"""transformers' own `model.generate` decoding speculatively through `custom_generate=
speculative_generate`: every drafter kind gives plain generate's greedy output, and the
streamer receives the prompt, then every new token in order, a round's tokens at a time."""

from __future__ import annotations

import pytest
import torch
from conftest import greedy_reference, perturbed_copy, tiny_model
from head_helpers import HEADS, build_head, fit
from transformers.generation.streamers import BaseStreamer

from draftsmith import FixedPolicy, speculative_generate
from draftsmith.artifact import save_artifact
from draftsmith.build import hf_generate
from draftsmith.heads import DraftModelDrafter

PROMPT = torch.tensor([[5, 6, 7]])  # a training prompt: the heads learned its greedy path


class Recorder(BaseStreamer):
    """What a streamer is handed: each `put` as a list of ids, and whether `end` came last."""

    def __init__(self) -> None:
        self.puts: list[list[int]] = []
        self.ended = False

    def put(self, value: torch.Tensor) -> None:
        assert not self.ended
        self.puts.append(value.flatten().tolist())

    def end(self) -> None:
        self.ended = True


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="module")
def drafters(target, tmp_path_factory, byte_tokenizer):
    """Each drafter kind as `generate(drafter=...)` takes it: spec strings (n-gram, a saved
    draft model, a saved EAGLE-3 artifact) and every head kind's `Drafter`, trained briefly."""
    root = tmp_path_factory.mktemp("drafters")
    perturbed_copy(target, scale=0.05).save_pretrained(root / "draft-model")
    byte_tokenizer.save_pretrained(root / "draft-model")
    eagle3 = fit(build_head("eagle3", target), target, steps=20)
    save_artifact(eagle3, target, root / "eagle3", training={"steps": 20}, target_name_or_path="t")
    kinds = {
        "ngram": "ngram",
        "draft-model": f"draft-model:{root / 'draft-model'}",
        "artifact": f"artifact:{root / 'eagle3'}",
    }

    def get(kind: str):
        if kind not in kinds:
            kinds[kind] = fit(build_head(kind, target), target, steps=20).as_drafter(target)
        return kinds[kind]

    return get


@pytest.mark.parametrize("kind", ["ngram", "draft-model", "artifact", *HEADS])
def test_every_drafter_kind_gives_plain_greedy_output_and_streams_it(kind, target, drafters):
    plain = target.generate(PROMPT, max_new_tokens=24, do_sample=False)
    streamer = Recorder()
    out = target.generate(
        PROMPT,
        custom_generate=speculative_generate,
        drafter=drafters(kind),
        draft_policy=FixedPolicy(max_draft_tokens=4),
        max_new_tokens=24,
        streamer=streamer,
    )
    assert out.tolist() == plain.tolist()
    assert streamer.puts[0] == PROMPT[0].tolist()
    assert sum(streamer.puts[1:], []) == out[0, PROMPT.shape[1] :].tolist()
    assert streamer.ended
    if kind != "ngram":  # a round that accepted drafted tokens streams them together
        assert max(len(chunk) for chunk in streamer.puts[1:]) > 1


def test_the_default_policy_decodes_the_same(target):
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    out = target.generate(
        PROMPT, custom_generate=speculative_generate, drafter="ngram", max_new_tokens=16
    )
    assert out.tolist() == plain.tolist()


def test_eos_stops_where_plain_generate_stops(target):
    reference = greedy_reference(target, PROMPT[0], 24)
    eos = reference[10]
    plain = target.generate(PROMPT, max_new_tokens=24, eos_token_id=eos, pad_token_id=0)
    streamer = Recorder()
    out = target.generate(
        PROMPT,
        custom_generate=speculative_generate,
        drafter=DraftModelDrafter(target),  # accepts everything: EOS comes mid-run, then a cut
        draft_policy=FixedPolicy(max_draft_tokens=6),
        max_new_tokens=24,
        eos_token_id=eos,
        pad_token_id=0,
        streamer=streamer,
    )
    assert out.tolist() == plain.tolist()
    assert out[0, -1] == eos and out.shape[1] < PROMPT.shape[1] + 24
    assert sum(streamer.puts[1:], []) == out[0, PROMPT.shape[1] :].tolist()


def test_a_padded_batch_gives_each_row_its_own_output(target):
    prompts = [[5, 6, 7, 40, 41], [9, 3]]
    ids = torch.tensor([prompts[0], [0, 0, 0, *prompts[1]]])
    mask = torch.tensor([[1] * 5, [0, 0, 0, 1, 1]])
    out = target.generate(
        ids,
        attention_mask=mask,
        custom_generate=speculative_generate,
        drafter="ngram",
        draft_policy=FixedPolicy(max_draft_tokens=3),
        max_new_tokens=12,
    )
    assert out[:, :5].tolist() == ids.tolist()
    for row, prompt in enumerate(prompts):
        assert out[row, 5:].tolist() == greedy_reference(target, torch.tensor(prompt), 12)


@pytest.mark.parametrize("narrowing", [{"top_k": 1}, {"top_p": 1e-6}])
def test_sampling_options_reach_the_decoder(narrowing, target):
    """Sampling narrowed to the most likely token is greedy decoding: so top_k and top_p are
    applied (sampled at temperature 2 without them, the outputs would differ)."""
    plain = target.generate(PROMPT, max_new_tokens=16, do_sample=False)
    torch.manual_seed(0)
    out = target.generate(
        PROMPT,
        custom_generate=speculative_generate,
        drafter="ngram",
        draft_policy=FixedPolicy(max_draft_tokens=3),
        max_new_tokens=16,
        do_sample=True,
        temperature=2.0,
        **narrowing,
    )
    assert out.tolist() == plain.tolist()
    torch.manual_seed(0)
    wide = target.generate(
        PROMPT,
        custom_generate=speculative_generate,
        drafter="ngram",
        max_new_tokens=16,
        do_sample=True,
        temperature=2.0,
        top_k=0,
    )
    assert wide.shape == out.shape and wide.tolist() != plain.tolist()


@pytest.mark.parametrize(
    "options, complaint",
    [
        ({"num_beams": 2}, "num_beams=2"),
        ({"num_return_sequences": 2, "do_sample": True}, "num_return_sequences=2"),
        ({"repetition_penalty": 1.3}, "RepetitionPenaltyLogitsProcessor"),
        ({"max_time": 5.0}, "MaxTimeCriteria"),
        ({"return_dict_in_generate": True}, "return_dict_in_generate"),
        ({"drafter": None}, "needs drafter="),
        ({"drafter": "magic"}, "unknown drafter spec 'magic'"),
    ],
)
def test_what_the_decoder_does_not_honour_is_a_clear_error(options, complaint, target):
    arguments = {"drafter": "ngram", "max_new_tokens": 4, **options}
    with pytest.raises(ValueError, match=complaint):
        target.generate(PROMPT, custom_generate=speculative_generate, **arguments)


def test_a_streamer_streams_one_prompt(target):
    with pytest.raises(ValueError, match="streams one prompt"):
        target.generate(
            torch.tensor([[5, 6], [7, 8]]),
            custom_generate=speculative_generate,
            drafter="ngram",
            max_new_tokens=4,
            streamer=Recorder(),
        )


def test_a_spec_builds_its_drafter_once_per_target(monkeypatch, drafters):
    target, built = tiny_model("llama", seed=0), []

    def build(*args, **kwargs):
        built.append(args[0])
        return build_drafter(*args, **kwargs)

    build_drafter = hf_generate.build_drafter
    monkeypatch.setattr(hf_generate, "build_drafter", build)
    for _ in range(2):
        target.generate(
            PROMPT,
            custom_generate=speculative_generate,
            drafter=drafters("artifact"),
            max_new_tokens=4,
        )
    assert built == [drafters("artifact")]

"""Bad input gets a clear error that names the problem and the fix."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_model

from draftsmith import SpeculativeDecoder
from draftsmith.heads import DraftModelDrafter, NgramDrafter


def test_vocabulary_mismatch_is_rejected(llama):
    other = tiny_model("llama", vocab_size=300)
    with pytest.raises(ValueError, match="vocabulary has 300 tokens but the target's has 256"):
        SpeculativeDecoder(llama, DraftModelDrafter(other))


def test_empty_prompt_is_rejected(llama):
    decoder = SpeculativeDecoder(llama, NgramDrafter())
    with pytest.raises(ValueError, match="prompt is empty"):
        decoder.generate([], max_new_tokens=4)


def test_prompt_longer_than_context_is_rejected(llama):
    decoder = SpeculativeDecoder(llama, NgramDrafter())
    with pytest.raises(ValueError, match="context of 256 positions: shorten the prompt"):
        decoder.generate(torch.ones(250, dtype=torch.long), max_new_tokens=10)


def test_text_prompt_without_tokenizer_is_rejected(llama):
    with pytest.raises(ValueError, match="needs a tokenizer"):
        SpeculativeDecoder(llama, NgramDrafter()).generate("def f():")


def test_out_of_vocabulary_prompt_is_rejected(llama):
    with pytest.raises(ValueError, match=r"must lie in \[0, 256\)"):
        SpeculativeDecoder(llama, NgramDrafter()).generate([1, 999])

"""Documents to token ids and loss masks: plain text and code, prompt-completion records and chat
records (`encode_documents`), before `draftsmith.data.documents` packs them into rows.

**Plain text and code** are tokenized as the tokenizer does by default (a BOS where it adds one),
end with EOS, and are concatenated into one stream cut into rows of `seq_len` tokens; a document
may continue into the next row. Every token is a target (``loss_mask == 1``).

**Prompt-completion records** (``prompt`` and ``completion`` fields, as `continue_texts` writes
them) are the prompt's tokens (the tokenizer's BOS first, where it adds one) then the
completion's, then EOS. With ``assistant_only_loss`` only the completion is a target: the prompt
is context, and so is the EOS, which the target did not write (the completion was cut at a
length).

**Chat records** are rendered with the target tokenizer's own chat template. With
``assistant_only_loss`` the mask covers each assistant turn's text plus the template's
end-of-turn token right after it (``<|im_end|>`` for ChatML): predicting the end of a turn is
part of drafting it. Headers, system and user turns are context only. The rendered text is
tokenized segment by segment (assistant texts on their own, as the target generates them after
its generation prompt), so the masked tokens decode to exactly the assistant texts. A template
that trims or rewrites assistant texts is an error.

``loss_mask[t] == 1`` means ``input_ids[t]`` is a training target, predicted from
``input_ids[:t]``; the trainer shifts.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from datasets import Dataset
from tqdm.auto import tqdm

__all__ = [
    "ChatTemplateError",
    "encode_chat",
    "encode_completion",
    "encode_documents",
    "encode_text",
]

_PLACEHOLDER = "\ue000"  # a private-use character: rare in text, and a collision is caught
_ENCODE_BATCH = 64  # documents per tokenizer call: amortizes the call, keeps early stops cheap


class ChatTemplateError(ValueError):
    """A chat record cannot be rendered so that its assistant tokens can be located."""


def encode_text(texts: Sequence[str], tokenizer: Any) -> list[list[int]]:
    """Token ids of each text, ending with EOS (the document separator in packed rows)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no EOS token to separate "
            f"documents; set tokenizer.eos_token"
        )
    encoded = tokenizer(list(texts), verbose=False)["input_ids"]
    return [ids if ids and ids[-1] == eos else [*ids, eos] for ids in encoded]


def encode_completion(
    prompt: str, completion: str, tokenizer: Any, *, assistant_only_loss: bool = True
) -> tuple[list[int], list[int]]:
    """One prompt-completion record: ids (T,) and loss mask (T,), 1 on the completion's tokens
    (on every token without `assistant_only_loss`).

    The two parts are tokenized apart, as the target saw them: the prompt as its input, the
    completion as the tokens it generated after it.
    """
    prompt_ids = tokenizer(prompt, verbose=False)["input_ids"]
    completion_ids = tokenizer(completion, add_special_tokens=False, verbose=False)["input_ids"]
    ids = [*prompt_ids, *completion_ids, tokenizer.eos_token_id]
    if not assistant_only_loss:
        return ids, [1] * len(ids)
    return ids, [0] * len(prompt_ids) + [1] * len(completion_ids) + [0]


def encode_chat(
    messages: Sequence[dict[str, str]], tokenizer: Any, *, assistant_only_loss: bool = True
) -> tuple[list[int], list[int]]:
    """One conversation rendered with the tokenizer's chat template.

    Returns:
        ids (T,) and loss mask (T,): 1 on each assistant turn's tokens and on the special token
        that follows each (the end-of-turn token); 1 everywhere without `assistant_only_loss`.

    Raises:
        ChatTemplateError: no chat template, or one that does not render assistant texts
            verbatim.
    """
    text, spans = _assistant_spans(messages, tokenizer)
    cuts = [0, *(i for span in spans for i in span), len(text)]
    segments = [text[a:b] for a, b in zip(cuts, cuts[1:], strict=False)]
    encoded = tokenizer(segments, add_special_tokens=False, verbose=False)["input_ids"]
    special = _special_ids(tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    for index, segment in enumerate(encoded):
        if index % 2:  # odd segments are the assistant texts
            flags = [1] * len(segment)
        else:
            flags = [0] * len(segment)
            if index and segment and segment[0] in special:
                flags[0] = 1  # the end-of-turn token closing the assistant text before it
        ids += segment
        mask += flags
    return ids, mask if assistant_only_loss else [1] * len(ids)


def _assistant_spans(
    messages: Sequence[dict[str, str]], tokenizer: Any
) -> tuple[str, list[tuple[int, int]]]:
    """The rendered conversation and the character span of each assistant text in it.

    Two renderings, whatever the number of turns: the real one, and one with each assistant
    text replaced by a unique placeholder. Putting the texts back in place of the placeholders
    must give the real rendering, which proves the spans (and rejects templates that trim or
    rewrite what the assistant said).
    """
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template, so chat records cannot "
            f"be rendered: use an instruct model's tokenizer or plain-text data."
        )
    text = _render(tokenizer, messages)
    answers = {i: m["content"] for i, m in enumerate(messages) if m["role"] == "assistant"}
    placeholders = {i: f"{_PLACEHOLDER}{i}{_PLACEHOLDER}" for i in answers}
    skeleton = _render(
        tokenizer,
        [{**m, "content": placeholders.get(i, m["content"])} for i, m in enumerate(messages)],
    )
    pieces: list[str] = []
    spans = []
    cursor = length = 0
    for i, answer in answers.items():
        at = skeleton.find(placeholders[i], cursor)
        if at < 0 or skeleton.count(placeholders[i]) != 1:
            break
        pieces += [skeleton[cursor:at], answer]
        length += at - cursor
        spans.append((length, length + len(answer)))
        length += len(answer)
        cursor = at + len(placeholders[i])
    if len(spans) < len(answers) or "".join(pieces) + skeleton[cursor:] != text:
        raise ChatTemplateError(
            f"the chat template of {tokenizer.name_or_path!r} does not render every assistant "
            f"text verbatim, once and in order, so their tokens cannot be masked reliably"
        )
    return text, spans


def _special_ids(tokenizer: Any) -> set[int]:
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return {*tokenizer.all_special_ids, *(i for i, token in added.items() if token.special)}


def _render(tokenizer: Any, messages: Sequence[dict[str, str]]) -> str:
    return tokenizer.apply_chat_template(list(messages), tokenize=False)


def encode_documents(
    documents: Dataset, tokenizer: Any, assistant_only_loss: bool, progress: tqdm | None = None
) -> Iterator[tuple[list[int], list[int]]]:
    """(ids, mask) of each document in order (the loss mask as packed rows carry it), tokenized
    a batch at a time (lazily: packing stops pulling once it has max_tokens)."""
    for start in range(0, len(documents), _ENCODE_BATCH):
        batch = documents[start : start + _ENCODE_BATCH]
        texts = [
            t
            for t, p, m in zip(batch["text"], batch["prompt"], batch["messages"], strict=True)
            if m is None and p is None
        ]
        encoded_texts = iter(encode_text(texts, tokenizer) if texts else [])
        for text, prompt, messages in zip(
            batch["text"], batch["prompt"], batch["messages"], strict=True
        ):
            if prompt is not None:
                ids, mask = encode_completion(
                    prompt, text, tokenizer, assistant_only_loss=assistant_only_loss
                )
            elif messages is None:
                ids = next(encoded_texts)
                mask = [1] * len(ids)
            else:
                ids, mask = encode_chat(
                    messages, tokenizer, assistant_only_loss=assistant_only_loss
                )
            if progress is not None:
                progress.update(1)  # before yielding: packing may never resume this generator
            yield ids, mask

"""Rewrite the assistant turns of chat records with the target itself.

A drafter learns to predict what the target says, so the best chat data has the target's own
answers (EAGLE, Medusa and SpecForge regenerate ShareGPT this way). Each record's assistant turns
are generated in order, each from the conversation so far (its user turns and the target's
earlier answers), batched across records with left padding.

Output is a jsonl of ``{"id", "messages"}`` records that `draftsmith.train.data` reads as a local
source. It is resumable: records whose id is already in the file are skipped, each batch is
flushed as it finishes, and a line torn by a kill is cut off before appending.

    documents = load_documents(DataConfig(source="chitchat"))
    regenerate(documents, model, tokenizer, "runs/chitchat-qwen.jsonl",
               RegenerateConfig(max_new_tokens=256, batch_size=16))
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

__all__ = ["RegenerateConfig", "completed_ids", "regenerate"]


@dataclass(kw_only=True)
class RegenerateConfig:
    """How the target answers."""

    max_new_tokens: int = 512
    """Longest answer per assistant turn, in tokens."""
    batch_size: int = 8
    """Records generated together (their turns are batched turn by turn)."""
    do_sample: bool = False
    """Sample answers (with temperature / top_p) instead of greedy decoding."""
    temperature: float = 1.0
    """Sampling temperature (with do_sample)."""
    top_p: float = 1.0
    """Nucleus sampling mass (with do_sample)."""
    seed: int = 0
    """Seeds torch's generator before sampling."""
    max_records: int | None = None
    """Write at most this many new records in this call, then return; None: all."""


def completed_ids(path: str | Path) -> set[str]:
    """Ids already written to the jsonl at `path` (empty if it does not exist).

    A last line without its newline was torn by a kill mid-write: it is cut off the file, so
    appending starts on a clean line and that record is generated again.
    """
    path = Path(path)
    if not path.exists():
        return set()
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    if len(complete) < len(data):
        with path.open("r+b") as handle:
            handle.truncate(len(complete))
    return {json.loads(line)["id"] for line in complete.decode("utf-8").splitlines() if line}


def regenerate(
    records: Iterable[dict[str, Any]],
    model: Any,
    tokenizer: Any,
    out_path: str | Path,
    config: RegenerateConfig | None = None,
) -> int:
    """Append regenerated copies of `records` to `out_path`, skipping ids already there.

    Args:
        records: chat records ``{"id", "messages"}`` (e.g. `load_documents` of a chat source).
        model: the target, a transformers causal LM.
        tokenizer: its tokenizer, with a chat template.
        out_path: jsonl to append to.
        config: generation settings.

    Returns:
        The number of records written by this call.
    """
    config = config or RegenerateConfig()
    out_path = Path(out_path)
    done = completed_ids(out_path)
    todo = [r for r in records if r["id"] not in done]
    for record in todo:
        if not record.get("messages"):
            raise ValueError(f"record {record['id']!r} is not a chat record (no 'messages')")
    if config.max_records is not None:
        todo = todo[: config.max_records]
    if config.do_sample:
        torch.manual_seed(config.seed)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    with out_path.open("a", encoding="utf-8") as out, tqdm(total=len(todo), unit="record") as bar:
        for start in range(0, len(todo), config.batch_size):
            batch = todo[start : start + config.batch_size]
            for record, messages in zip(
                batch, _answer(batch, model, tokenizer, config), strict=True
            ):
                out.write(json.dumps({"id": record["id"], "messages": messages}) + "\n")
            out.flush()  # a kill loses at most the batch in flight
            bar.update(len(batch))
    return len(todo)


def _answer(
    batch: Sequence[dict[str, Any]], model: Any, tokenizer: Any, config: RegenerateConfig
) -> list[list[dict[str, str]]]:
    """The batch's conversations with every assistant turn replaced by the target's answer."""
    conversations = [[dict(m) for m in record["messages"]] for record in batch]
    # An opening assistant turn answers nothing: it is kept as it is.
    turns = [[i for i, m in enumerate(c) if m["role"] == "assistant" and i] for c in conversations]
    for k in range(max(map(len, turns), default=0)):
        slots = [(c, positions[k]) for c, positions in enumerate(turns) if k < len(positions)]
        prompts = [
            tokenizer.apply_chat_template(
                conversations[c][:i], tokenize=False, add_generation_prompt=True
            )
            for c, i in slots
        ]
        for (c, i), text in zip(slots, _generate(prompts, model, tokenizer, config), strict=True):
            conversations[c][i]["content"] = text
    return conversations


@torch.no_grad()
def _generate(
    prompts: list[str], model: Any, tokenizer: Any, config: RegenerateConfig
) -> list[str]:
    """One batched `generate` over rendered prompts (left-padded); the answers' text."""
    eos = {tokenizer.eos_token_id}
    model_eos = model.generation_config.eos_token_id
    eos |= set(model_eos) if isinstance(model_eos, list) else {model_eos}
    eos.discard(None)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    try:
        inputs = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    finally:
        tokenizer.padding_side = side
    sampling = (
        {"do_sample": True, "temperature": config.temperature, "top_p": config.top_p}
        if config.do_sample
        else {"do_sample": False}
    )
    output = model.generate(
        **inputs.to(model.device),
        max_new_tokens=config.max_new_tokens,
        eos_token_id=sorted(eos),
        pad_token_id=pad,
        **sampling,
    )
    answers = []
    for row in output[:, inputs["input_ids"].shape[1] :].tolist():
        end = next((j for j, token in enumerate(row) if token in eos), len(row))
        answers.append(tokenizer.decode(row[:end], skip_special_tokens=True))
    return answers

"""``draftsmith prepare-data`` and ``draftsmith regenerate``: training data from a source."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from transformers import AutoTokenizer

from draftsmith.commands.flags import as_config
from draftsmith.core.models import Dtype, load_model
from draftsmith.core.zoo import resolve_model
from draftsmith.data.documents import DataConfig, Split, load_documents, prepare_data
from draftsmith.data.regenerate import (
    RegenerateConfig,
    completed_ids,
    continue_texts,
    regenerate,
)


@dataclass(kw_only=True)
class PrepareDataCommand(DataConfig):
    """Tokenize and pack a data source into fixed-length training rows (an Arrow folder)."""

    target: str
    """Zoo name, local folder or hub id of the target model, whose tokenizer and chat template
    render the data."""
    out: Path
    """Output folder (Arrow)."""
    overwrite: bool = False
    """Replace an existing --out."""

    def run(self) -> Path:
        """Returns the output folder."""
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.target))
        config = as_config(self, DataConfig)
        return prepare_data(config, tokenizer, self.out, overwrite=self.overwrite)


@dataclass(kw_only=True)
class RegenerateCommand(RegenerateConfig):
    """Training data in the target's own words: chat answers rewritten by the target, text and
    code continued by it (jsonl, resumable: a rerun finishes what is missing)."""

    FLAG_ALIASES: ClassVar[dict[str, tuple[str, ...]]] = {"do_sample": ("--sample",)}

    target: str
    """Zoo name, local folder or hub id of the target model."""
    source: str
    """stdlib, chitchat, a local file or folder, or a Hugging Face dataset name."""
    out: Path
    """jsonl to write (a rerun resumes it)."""
    split: Split = "train"
    """Which split of the source to regenerate."""
    dtype: Dtype = "auto"
    """Precision of the target (auto: its checkpoint's own)."""

    def run(self) -> int:
        """Chat sources get their answers rewritten, text sources are continued
        (`continue_texts`). Returns the number of records written."""
        documents = load_documents(DataConfig(source=self.source, split=self.split, seed=self.seed))
        model, tokenizer = load_model(self.target, dtype=self.dtype)
        config = as_config(self, RegenerateConfig)
        chat = [d for d in documents if d["messages"]]
        text = [d for d in documents if not d["messages"]]
        written = 0
        if chat:
            written += regenerate(chat, model, tokenizer, self.out, config)
        if text:
            written += continue_texts(text, model, tokenizer, self.out, config)
        print(f"{self.out}: {written:,} new records ({len(completed_ids(self.out)):,} in all)")
        return written

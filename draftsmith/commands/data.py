"""``draftsmith prepare-data`` and ``draftsmith regenerate``: training data from a source."""

from __future__ import annotations

import multiprocessing
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import torch
from transformers import AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from draftsmith.artifact import load_drafter, read_artifact_config
from draftsmith.build.flags import Range, above, as_config, at_least, between
from draftsmith.core.models import Dtype, check_same_vocabulary
from draftsmith.data.documents import DataConfig, Split, load_documents, prepare_data
from draftsmith.data.regenerate import (
    RegenerateConfig,
    Shard,
    completed_ids,
    continue_texts,
    merge_parts,
    parts_dir,
    regenerate,
)
from draftsmith.heads import DraftModelDrafter
from draftsmith.zoo import load_model, resolve_model


@dataclass(kw_only=True)
class PrepareDataCommand(DataConfig):
    """Tokenize and pack a data source into fixed-length training rows (an Arrow folder)."""

    FLAG_RANGES: ClassVar[dict[str, Range]] = {
        "seq_len": at_least(2),
        "max_tokens": at_least(2),
        "max_documents": at_least(1),
        "heldout_fraction": between(0, 1, high_open=True),
        "seed": at_least(0),
    }

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
    code continued by it (jsonl, resumable: a rerun finishes what is missing); with --draft,
    on-policy data written by a draft model instead."""

    FLAG_ALIASES: ClassVar[dict[str, tuple[str, ...]]] = {"do_sample": ("--sample",)}
    FLAG_RANGES: ClassVar[dict[str, Range]] = {
        "max_new_tokens": at_least(1),
        "batch_size": at_least(1),
        "temperature": above(0),
        "top_p": between(0, 1, low_open=True),
        "seed": at_least(0),
        "max_records": at_least(1),
        "prompt_tokens": at_least(1),
        "max_prompt_tokens": at_least(1),
        "prompts_per_document": at_least(1),
        "max_turns": at_least(1),
        "processes": at_least(1),
    }

    target: str
    """Zoo name, local folder or hub id of the target model."""
    source: str
    """stdlib, chitchat, a local file or folder, or a Hugging Face dataset name."""
    out: Path
    """jsonl to write (a rerun resumes it)."""
    split: Split = "train"
    """Which split of the source to regenerate."""
    dtype: Dtype = "auto"
    """Precision of the model that writes (auto:
    bfloat16 on a GPU and on a CPU with bf16 matrix units, AMX or AVX512-BF16; float32
    elsewhere)."""
    draft: str | None = None
    """On-policy data (DistillSpec): the draft model writes the answers instead of the target,
    and training scores them with the target's distributions. A zoo name or folder of a causal
    LM sharing the target's tokenizer, or artifact:DIR of a trained draft model (a distilled
    one); use it with --sample. None: the target writes."""
    processes: int = 1
    """Processes that generate at once, each loading the model, with an equal share of the
    torch threads, and taking every N-th batch; the output is the same records in the same
    order. On a CPU a small model decodes faster as processes of one thread than as threads of
    one process (benchmarks/notes/training.md); each process holds its own copy of the model."""

    def run(self) -> int:
        """Chat sources get their answers rewritten, text sources are continued
        (`continue_texts`). Returns the number of records written."""
        if self.draft is not None and self.draft.startswith("artifact:"):
            read_artifact_config(self.draft.removeprefix("artifact:"))  # before loading models
        documents = self.documents()  # a bad source fails here, before any process starts
        parallel = self.processes > 1
        written = self._write_in_processes() if parallel else self.write(documents)
        print(f"{self.out}: {written:,} new records ({len(completed_ids(self.out)):,} in all)")
        return written

    def documents(self) -> Iterable[dict]:
        """The source's documents of --split."""
        return load_documents(DataConfig(source=self.source, split=self.split, seed=self.seed))

    def write(self, documents: Iterable[dict], shard: Shard | None = None) -> int:
        """Generate what `run` writes from `documents` (`shard`: this process's share, into the
        parts folder for `merge_parts`); returns the records written."""
        model, tokenizer = self._writer()
        config = as_config(self, RegenerateConfig)
        chat = [d for d in documents if d["messages"]]
        text = [d for d in documents if not d["messages"]]
        written = 0
        if chat:
            written += regenerate(chat, model, tokenizer, self.out, config, shard)
        if text:
            written += continue_texts(text, model, tokenizer, self.out, config, shard)
        return written

    def _write_in_processes(self) -> int:
        """`write` in --processes spawned processes, then their batches merged into --out."""
        written = merge_parts(self.out)  # what an interrupted run finished: every shard then
        # reads the same --out and plans the same batches
        threads = max(1, torch.get_num_threads() // self.processes)
        spawn = multiprocessing.get_context("spawn")
        workers = [
            spawn.Process(target=_write_shard, args=(self, Shard(k, self.processes), threads))
            for k in range(self.processes)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        failed = [k + 1 for k, worker in enumerate(workers) if worker.exitcode]
        if failed:
            raise ChildProcessError(
                f"regeneration process(es) {failed} of {self.processes} failed (the error is "
                f"printed above); the batches finished are kept in {parts_dir(self.out)}: rerun "
                "the same command to finish the rest"
            )
        return written + merge_parts(self.out)

    def _writer(self) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """The model that writes (the target, or the --draft checked to write in the target's
        token ids) and the target's tokenizer."""
        if self.draft is None:
            return load_model(self.target, dtype=self.dtype)
        if self.draft.startswith("artifact:"):
            target, tokenizer = load_model(self.target, dtype=self.dtype)
            drafter = load_drafter(self.draft.removeprefix("artifact:"), target)
            if not isinstance(drafter, DraftModelDrafter):
                raise ValueError(
                    f"--draft {self.draft}: that artifact's drafter reads the target's features "
                    "and cannot write text alone: give a draft model (a distilled artifact, a "
                    "zoo name or a folder)"
                )
            return drafter.model, tokenizer
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.target))
        model, draft_tokenizer = load_model(self.draft, dtype=self.dtype)
        check_same_vocabulary(tokenizer, draft_tokenizer, self.draft)
        return model, tokenizer


def _write_shard(command: RegenerateCommand, shard: Shard, threads: int) -> None:
    """One spawned process's share of `RegenerateCommand._write_in_processes`."""
    torch.set_num_threads(threads)
    try:
        command.write(command.documents(), shard)
    except Exception as error:  # one line, as the command's own errors
        message = " ".join(str(error).split())
        print(
            f"draftsmith regenerate (process {shard.index + 1}): error: {message}", file=sys.stderr
        )
        sys.exit(1)

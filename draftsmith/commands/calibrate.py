"""``draftsmith calibrate`` / ``scripts/calibrate.py``: calibrate an artifact's confidence."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from datasets import Dataset

from draftsmith.artifact import load_head, read_artifact_config
from draftsmith.artifact.engines import foreign_layout
from draftsmith.calibration import calibrator_class
from draftsmith.calibration.collect import collect_from_decoding, collect_teacher_forced
from draftsmith.calibration.pipeline import CalibrateConfig, calibrate_records, prompts_from_texts
from draftsmith.calibration.report import format_table
from draftsmith.commands.flags import POSITIONAL, as_config
from draftsmith.core.models import Dtype, load_model
from draftsmith.data.documents import DataConfig, encode_documents, load_documents
from draftsmith.decoding import DraftLengthPolicy, SpeculativeDecoder


@dataclass(kw_only=True)
class CalibrateCommand(CalibrateConfig):
    """Calibrate an artifact's confidence on held-out data: fit how likely the target is to
    accept each drafted token, and write calibration.json and a report into the artifact."""

    artifact: Path = field(metadata=POSITIONAL)
    """Drafter artifact directory."""
    target: str
    """Zoo name, local folder or hub id of the artifact's target model."""
    data: str
    """Held-out data: a jsonl file (taken whole) with 'text', 'prompt' + 'completion' (e.g.
    `draftsmith regenerate` output) or, for --collect decode, 'prompt' fields; or a source name
    (stdlib, chitchat: its held-out split)."""
    dtype: Dtype = "auto"
    """Precision of the target (auto: its checkpoint's own)."""
    draft_tokens: int = 4
    """decode: most tokens drafted per round."""

    def __post_init__(self) -> None:
        calibrator_class(self.method)  # an unknown method fails before any model loads

    def run(self) -> dict:
        config = as_config(self, CalibrateConfig)
        layout = foreign_layout(self.artifact)
        if layout is not None:
            raise ValueError(
                f"{self.artifact} holds a head in the {layout} layout; calibration writes into a "
                f"draftsmith artifact: import it first (draftsmith import {self.artifact} "
                "--target NAME --out ARTIFACT), then calibrate ARTIFACT"
            )
        read_artifact_config(self.artifact)  # a broken artifact fails before any model loads
        # Greedy calibration still reads the signals of the softmax at temperature 1.
        temperature = self.temperature if self.temperature > 0 else 1.0
        # The held-out data is read (and checked) before the target loads, tokenized after.
        if self.collect == "teacher-forced":
            documents = load_documents(self._data_config())
            target, tokenizer = load_model(self.target, dtype=self.dtype)
            head = load_head(self.artifact, target)
            records = collect_teacher_forced(
                head, target, self._encode(documents, tokenizer), temperature=temperature
            )
        else:
            prompts, texts = self._prompts_and_texts()
            target, tokenizer = load_model(self.target, dtype=self.dtype)
            head = load_head(self.artifact, target)
            policy = DraftLengthPolicy(max_draft_tokens=self.draft_tokens)
            decoder = SpeculativeDecoder(target, head.as_drafter(target), tokenizer, policy=policy)
            records = collect_from_decoding(
                decoder,
                self._cut_prompts(prompts, texts, tokenizer),
                max_new_tokens=self.max_new_tokens,
                temperature=temperature,
                decode_temperature=self.temperature,
                seed=self.seed,
            )
        metadata = {"target": self.target, "data": self.data, "artifact": str(self.artifact)}
        payload = calibrate_records(records, self.artifact, config, metadata)
        _print_summary(payload, self.collect, self.artifact)
        return payload

    def _data_config(self) -> DataConfig:
        # A file is held-out data as a whole: heldout_fraction 0 puts all of it in one split (a
        # missing path is `load_documents`' clear error).
        whole = Path(self.data).exists()
        split = {"split": "train", "heldout_fraction": 0.0} if whole else {"split": "heldout"}
        return DataConfig(source=self.data, seq_len=self.seq_len, **split)

    def _encode(self, documents: Dataset, tokenizer) -> list:
        """(input_ids, loss_mask) of each held-out document, cut to seq_len tokens, up to
        max_tokens in all."""
        encoded, total = [], 0
        assistant_only = self._data_config().assistant_only_loss
        for ids, mask in encode_documents(documents, tokenizer, assistant_only):
            ids, mask = ids[: self.seq_len], mask[: self.seq_len]
            if any(mask[1:]):  # something to draft after the first token
                encoded.append((torch.tensor(ids), torch.tensor(mask, dtype=torch.int8)))
                total += len(ids)
            if total >= self.max_tokens:
                break
        if len(encoded) < 2:
            raise ValueError(
                f"calibration data {self.data} gives {len(encoded)} document(s) with tokens to "
                "draft; calibration fits on some documents and evaluates on others: give at "
                "least 2"
            )
        return encoded

    def _prompts_and_texts(self) -> tuple[list[str], list[str]]:
        """`prompt` fields (used as they are) and `text` fields (cut into prompts) of a jsonl
        file, or the texts of a data source's held-out split."""
        path = Path(self.data)
        if path.suffix != ".jsonl":
            documents = load_documents(DataConfig(source=self.data, split="heldout"))
            return [], [t for t in documents["text"] if t]
        if not path.is_file():
            raise FileNotFoundError(f"calibration data {path} does not exist")
        records = []
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise ValueError(f"{path}:{line_no}: not a JSON record ({error})") from None
        prompts = [r["prompt"] for r in records if isinstance(r, dict) and r.get("prompt")]
        texts = [r["text"] for r in records if isinstance(r, dict) and r.get("text")]
        if not prompts and not texts:
            raise ValueError(f"{path} holds no record with a 'text' or 'prompt' field")
        return prompts, texts

    def _cut_prompts(self, prompts: list, texts: list[str], tokenizer) -> list:
        """The prompts, topped up to max_prompts with windows cut from the texts."""
        stride = self.prompt_tokens + self.max_new_tokens
        if texts and len(prompts) < self.max_prompts:
            prompts = prompts + prompts_from_texts(
                texts, tokenizer, self.prompt_tokens, stride, self.max_prompts - len(prompts)
            )
        return prompts[: self.max_prompts]


def _print_summary(payload: dict, collect: str, artifact: Path) -> None:
    print(f"calibrator: {payload['method']} on {', '.join(payload['signals'])}")
    print(
        f"outcome: {payload['outcome']} ({collect}) over {payload['n_eval']} drafted "
        f"tokens; after: {payload['evaluation']}"
    )
    print(format_table(payload["metrics"]["before"], payload["metrics"]["after"]))
    ci = payload["ece_equal_mass_ci95"]
    print(
        "ece_equal_mass 95% interval (bootstrap over documents / prompts): before "
        f"[{ci['before'][0]:.4f}, {ci['before'][1]:.4f}], after "
        f"[{ci['after'][0]:.4f}, {ci['after'][1]:.4f}]"
    )
    print(f"wrote {artifact / 'calibration.json'} and {artifact / 'calibration'}/")

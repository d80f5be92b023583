"""``draftsmith calibrate`` / ``scripts/calibrate.py``: calibrate an artifact's confidence, or
evaluate its existing calibration on new data (--evaluate-only)."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
from datasets import Dataset

from draftsmith.artifact import (
    load_acceptance_head,
    load_acceptance_model,
    load_head,
    read_artifact_config,
)
from draftsmith.artifact.acceptance import ACCEPTANCE_ENTRY
from draftsmith.artifact.engines import foreign_layout
from draftsmith.calibration import CALIBRATION_FILE, Calibrator, calibrator_class
from draftsmith.calibration.collect import collect_from_decoding, collect_teacher_forced
from draftsmith.calibration.evaluate import DEFAULT_WORKLOAD, evaluate_calibration, outcome_column
from draftsmith.calibration.heldout import HeldOutRecords, read_heldout_jsonl
from draftsmith.calibration.io import read_calibration, write_json
from draftsmith.calibration.pipeline import (
    CalibrateConfig,
    Collection,
    calibrate_records,
    prompt_windows,
)
from draftsmith.calibration.report import format_table, format_workload_table
from draftsmith.commands.flags import POSITIONAL, as_config
from draftsmith.core.models import Dtype
from draftsmith.zoo import load_model
from draftsmith.core.signals import ACCEPTANCE_HEAD_SIGNAL
from draftsmith.data.documents import DataConfig, encode_documents, load_documents
from draftsmith.decoding import FixedPolicy, SpeculativeDecoder
from draftsmith.heads import DraftHead
from draftsmith.heads.acceptance import AcceptanceHead
from draftsmith.heads.learned_acceptance import LearnedAcceptance


@dataclass(kw_only=True)
class CalibrateCommand(CalibrateConfig):
    """Calibrate an artifact's confidence on held-out data: fit how likely the target is to
    accept each drafted token, and write calibration.json and a report into the artifact. With
    --evaluate-only, score the artifact's existing calibration on the data instead, per
    workload, and leave the artifact untouched."""

    artifact: Path = field(metadata=POSITIONAL)
    """Drafter artifact directory."""
    target: str
    """Zoo name, local folder or hub id of the artifact's target model."""
    data: str
    """Held-out data: a jsonl file (taken whole) of prompt-only records ({"prompt", "workload"
    optional}: a user's own traffic, collected from decoding), or of 'text' / 'prompt' +
    'completion' (e.g. `draftsmith regenerate` output) / 'messages' records; or a source name
    (stdlib, chitchat: its held-out split)."""
    collect: Literal["auto", "teacher-forced", "decode"] = "auto"
    """auto: decode for prompt-only records, teacher-forced otherwise; teacher-forced: score
    draft chains at every position of held-out text in one pass (exact for greedy decoding where
    the text is the target's own greedy output; see `draftsmith.calibration.collect`); decode:
    record real decoding runs of the prompts (and of prompts cut from the texts)."""
    evaluate_only: bool = False
    """Refit nothing: score the raw top-1 probability and the artifact's calibration.json on
    the data, per workload and overall; writes nothing into the artifact."""
    json: Path | None = None
    """Also write the result here as JSON (the --evaluate-only report, or the calibration
    summary); outside the artifact."""
    dtype: Dtype = "auto"
    """Precision of the target (auto: its checkpoint's own)."""
    draft_tokens: int = 4
    """decode: most tokens drafted per round."""

    def __post_init__(self) -> None:
        calibrator_class(self.method)  # an unknown method fails before any model loads

    def run(self) -> dict:
        self._check_artifact()
        # Everything read from disk is checked before the target loads.
        calibrator = self._existing_calibrator() if self.evaluate_only else None
        heldout = read_heldout_jsonl(self.data) if self.data.endswith(".jsonl") else None
        collect, reason = self._collection(heldout)
        print(f"{reason}: collecting {'from decoding' if collect == 'decode' else collect}")
        records = self._collect(collect, heldout)
        if self.evaluate_only:
            result = self._evaluate(records, calibrator, collect)
        else:
            config = replace(as_config(self, CalibrateConfig), collect=collect)
            metadata = {"target": self.target, "data": self.data, "artifact": str(self.artifact)}
            result = calibrate_records(records, self.artifact, config, metadata)
            _print_summary(result, collect, self.artifact)
        if self.json is not None:
            self.json.parent.mkdir(parents=True, exist_ok=True)
            print(f"wrote {write_json(self.json, result)}")
        return result

    def _check_artifact(self) -> None:
        """Fail on a foreign or broken artifact, and on a --json inside it, before any model
        loads."""
        layout = foreign_layout(self.artifact)
        if layout is not None:
            raise ValueError(
                f"{self.artifact} holds a head in the {layout} layout; calibration writes into a "
                f"draftsmith artifact: import it first (draftsmith import {self.artifact} "
                "--target NAME --out ARTIFACT), then calibrate ARTIFACT"
            )
        config = read_artifact_config(self.artifact)
        if ACCEPTANCE_HEAD_SIGNAL in self.signals and ACCEPTANCE_ENTRY not in config:
            raise ValueError(
                f"--signals names {ACCEPTANCE_HEAD_SIGNAL}, but {self.artifact} has no learned "
                "acceptance head: train one into it (recipes/smollm2-135m/acceptance-head.yaml) "
                "or calibrate other signals"
            )
        if self.json is not None and self.json.resolve().is_relative_to(self.artifact.resolve()):
            raise ValueError(
                f"--json {self.json} lies inside the artifact {self.artifact}, whose files are "
                "calibration's own: write the JSON elsewhere"
            )

    def _existing_calibrator(self) -> Calibrator | None:
        """The artifact's calibrator, None (with a warning) when it has none."""
        path = self.artifact / CALIBRATION_FILE
        try:
            calibrator = load_acceptance_model(self.artifact)
        except ValueError as error:
            raise ValueError(
                f"--evaluate-only: {path} cannot be read ({error}); refit it (draftsmith "
                f"calibrate {self.artifact} --target ... --data ..., without --evaluate-only) "
                "or delete it to evaluate the raw confidence alone"
            ) from error
        if calibrator is None:
            warnings.warn(
                f"{self.artifact} has no {CALIBRATION_FILE}: evaluating the raw top-1 "
                "probability only (draftsmith calibrate without --evaluate-only fits one)",
                stacklevel=2,
            )
            return None
        fitted_at = read_calibration(path).get("temperature", 0.0)
        if fitted_at != self.temperature:
            warnings.warn(
                f"{path} was fitted at --temperature {fitted_at}, evaluated here at "
                f"{self.temperature}: pass --temperature {fitted_at} to evaluate it as fitted",
                stacklevel=2,
            )
        return calibrator

    def _collection(self, heldout: HeldOutRecords | None) -> tuple[Collection, str]:
        """The collection to run, and why (printed)."""
        prompt_only = heldout is not None and not heldout.has_text
        if prompt_only and self.collect == "teacher-forced":
            raise ValueError(
                f"{self.data} holds prompt-only records (no 'text', 'completion' or 'messages'), "
                "and teacher-forced collection scores a text the target continues: drop "
                "--collect teacher-forced (prompt-only data is collected from decoding), or "
                "give records with text (draftsmith regenerate writes prompt + completion)"
            )
        if self.collect != "auto":
            return self.collect, f"--collect {self.collect}"
        if prompt_only:
            return "decode", "prompt-only records"
        return "teacher-forced", "held-out text"

    def _collect(self, collect: Collection, heldout: HeldOutRecords | None) -> Dataset:
        """The drafted-token records; from decoding they carry each prompt's workload."""
        # Greedy calibration still reads the signals of the softmax at temperature 1.
        temperature = self.temperature if self.temperature > 0 else 1.0
        if collect == "teacher-forced":
            if heldout is not None and any(w != DEFAULT_WORKLOAD for w in heldout.workloads):
                warnings.warn(
                    "teacher-forced collection keeps no workload names: every record counts "
                    "under 'default' (--collect decode keeps them)",
                    stacklevel=2,
                )
            documents = load_documents(self._data_config())
            target, tokenizer = load_model(self.target, dtype=self.dtype)
            head, acceptance = self._heads(target)
            encoded = self._encode(documents, tokenizer)
            return collect_teacher_forced(
                head, target, encoded, temperature=temperature, acceptance=acceptance
            )
        heldout = heldout or self._source_texts()
        target, tokenizer = load_model(self.target, dtype=self.dtype)
        head, acceptance = self._heads(target)
        policy = FixedPolicy(max_draft_tokens=self.draft_tokens)
        drafter = head.as_drafter(target)
        decoder = SpeculativeDecoder(target, drafter, tokenizer, policy=policy)
        prompts, workloads = self._decode_prompts(heldout, tokenizer)
        records = collect_from_decoding(
            decoder,
            prompts,
            max_new_tokens=self.max_new_tokens,
            temperature=temperature,
            decode_temperature=self.temperature,
            seed=self.seed,
            acceptance=None if acceptance is None else LearnedAcceptance(acceptance, drafter),
        )
        return records.add_column("workload", [workloads[s] for s in records["source"]])

    def _heads(self, target) -> tuple[DraftHead, AcceptanceHead | None]:
        """The artifact's head and its learned acceptance head (None: it has none), whose
        P(accept) the records then carry as a signal."""
        head = load_head(self.artifact, target)
        acceptance = load_acceptance_head(self.artifact, head.state_size)
        return head, None if acceptance is None else acceptance.to(target.device)

    def _evaluate(self, records: Dataset, calibrator: Calibrator | None, collect: str) -> dict:
        """Score the raw and the existing calibrated confidence on the records; print a table."""
        outcome = outcome_column(self.temperature)
        report = {
            "artifact": str(self.artifact),
            "target": self.target,
            "data": self.data,
            "collect": collect,
            "outcome": outcome,
            "temperature": self.temperature,
            "n_bins": self.n_bins,
            "calibrator": None if calibrator is None else calibrator.to_dict(),
            **evaluate_calibration(records, calibrator, outcome=outcome, n_bins=self.n_bins),
        }
        kind = "raw only" if calibrator is None else f"raw vs {calibrator.kind} (calibration.json)"
        print(f"evaluation of {self.artifact}, {kind}, outcome {outcome}, nothing refitted:")
        rows = [*report["workloads"].items(), ("overall", report["overall"])]
        print(format_workload_table(rows))
        return report

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
        # Fitting cross-fits over documents; evaluating one needs no other.
        if len(encoded) < 2 and not self.evaluate_only:
            raise ValueError(
                f"calibration data {self.data} gives {len(encoded)} document(s) with tokens to "
                "draft; calibration fits on some documents and evaluates on others: give at "
                "least 2"
            )
        return encoded

    def _source_texts(self) -> HeldOutRecords:
        """The texts of a data source's held-out split (or of a non-jsonl file), to cut."""
        documents = load_documents(DataConfig(source=self.data, split="heldout"))
        texts = [(text, DEFAULT_WORKLOAD) for text in documents["text"] if text]
        return HeldOutRecords(self.data, prompts=[], texts=texts, has_text=True)

    def _decode_prompts(self, heldout: HeldOutRecords, tokenizer) -> tuple[list, list[str]]:
        """Up to max_prompts prompts to decode, the given ones (strings, as they are) first,
        then windows of token ids cut from the texts; and the workload of each."""
        if not heldout.prompts and not heldout.texts:
            raise ValueError(
                f"{heldout.name} has no 'prompt' or 'text' to decode (chat 'messages' only): "
                "collect teacher-forced (--collect auto or teacher-forced)"
            )
        given = heldout.prompts[: self.max_prompts]
        prompts, workloads = [p for p, _ in given], [w for _, w in given]
        room = self.max_prompts - len(prompts)
        if heldout.texts and room > 0:
            stride = self.prompt_tokens + self.max_new_tokens
            texts = [text for text, _ in heldout.texts]
            for index, window in prompt_windows(texts, tokenizer, self.prompt_tokens, stride, room):
                prompts.append(window)
                workloads.append(heldout.texts[index][1])
        return prompts, workloads


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
    by_workload = payload.get("metrics_by_workload", {})
    if len(by_workload) > 1:
        print("per workload (after: cross-fitted, each token scored out of sample):")
        print(format_workload_table(list(by_workload.items())))
    print(f"wrote {artifact / 'calibration.json'} and {artifact / 'calibration'}/")

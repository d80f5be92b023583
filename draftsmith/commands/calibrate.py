"""``draftsmith calibrate``: calibrate an artifact's confidence, or
evaluate its existing calibration on new data (--evaluate-only)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from draftsmith.artifact.calibrate import prepare_calibration
from draftsmith.build.flags import POSITIONAL, Range, as_config, at_least
from draftsmith.calibration import calibrator_class
from draftsmith.calibration.heldout import CollectChoice
from draftsmith.calibration.io import write_json
from draftsmith.calibration.pipeline import CalibrateConfig
from draftsmith.calibration.report import format_table, format_workload_table
from draftsmith.core.models import Dtype
from draftsmith.zoo import load_model


@dataclass(kw_only=True)
class CalibrateCommand(CalibrateConfig):
    """Calibrate an artifact's confidence on held-out data: fit how likely the target is to
    accept each drafted token, and write calibration.json and a report into the artifact. With
    --evaluate-only, score the artifact's existing calibration on the data instead, per
    workload, and leave the artifact untouched."""

    FLAG_RANGES: ClassVar[dict[str, Range]] = {
        "temperature": at_least(0),
        "seq_len": at_least(2),
        "max_tokens": at_least(1),
        "prompt_tokens": at_least(1),
        "max_new_tokens": at_least(1),
        "max_prompts": at_least(1),
        "folds": at_least(2),
        "n_bins": at_least(1),
        "seed": at_least(0),
        "draft_tokens": at_least(1),
    }

    artifact: Path = field(metadata=POSITIONAL)
    """Drafter artifact directory."""
    target: str
    """Zoo name, local folder or hub id of the artifact's target model."""
    data: str
    """Held-out data: a jsonl file (taken whole) of prompt-only records ({"prompt", "workload"
    optional}: a user's own traffic, collected from decoding), or of 'text' / 'prompt' +
    'completion' (e.g. `draftsmith regenerate` output) / 'messages' records; or a source name
    (stdlib, chitchat: its held-out split)."""
    collect: CollectChoice = "auto"
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
    """Precision of the target (auto:
    bfloat16 on a GPU and on a CPU with bf16 matrix units, AMX or AVX512-BF16; float32
    elsewhere)."""
    draft_tokens: int = 4
    """decode: most tokens drafted per round."""

    def __post_init__(self) -> None:
        calibrator_class(self.method)  # an unknown method fails before any model loads

    def run(self) -> dict:
        self._check_json()
        # Everything read from disk is checked before the target loads.
        calibration = prepare_calibration(
            self.artifact,
            self.data,
            as_config(self, CalibrateConfig),
            collect=self.collect,
            evaluate_only=self.evaluate_only,
            draft_tokens=self.draft_tokens,
        )
        data = calibration.data
        how = "from decoding" if data.collect == "decode" else data.collect
        print(f"{data.reason}: collecting {how}")
        target, tokenizer = load_model(self.target, dtype=self.dtype)
        result = calibration.run(target, tokenizer, target_name=self.target)
        if self.evaluate_only:
            _print_evaluation(result)
        else:
            _print_summary(result, data.collect, self.artifact)
        if self.json is not None:
            self.json.parent.mkdir(parents=True, exist_ok=True)
            print(f"wrote {write_json(self.json, result)}")
        return result

    def _check_json(self) -> None:
        """Refuse a --json inside the artifact before anything is read."""
        if self.json is not None and self.json.resolve().is_relative_to(self.artifact.resolve()):
            raise ValueError(
                f"--json {self.json} lies inside the artifact {self.artifact}, whose files are "
                "calibration's own: write the JSON elsewhere"
            )


def _print_evaluation(report: dict) -> None:
    calibrator = report["calibrator"]
    kind = "raw only" if calibrator is None else f"raw vs {calibrator['kind']} (calibration.json)"
    print(
        f"evaluation of {report['artifact']}, {kind}, outcome {report['outcome']}, "
        "nothing refitted:"
    )
    rows = [*report["workloads"].items(), ("overall", report["overall"])]
    print(format_workload_table(rows))


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

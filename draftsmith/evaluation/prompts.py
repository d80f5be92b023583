"""Prompt files for benchmarks: the bundled set (code, chat and prose) and any jsonl of
``{"prompt", "workload"}`` records."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

BUNDLED_PROMPTS = "bench_prompts.jsonl"


def bundled_prompts() -> Path:
    """The prompt set shipped with the package (code, chat and prose)."""
    return Path(str(resources.files("draftsmith.evaluation") / BUNDLED_PROMPTS))


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    """Read a jsonl of {"prompt": str, "workload": str (optional)} records."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"prompt file {path} does not exist: give a jsonl with 'prompt' fields"
        )
    records = []
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{line_no}: not a JSON record ({error})") from None
        prompt = record.get("prompt") if isinstance(record, dict) else None
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"{path}:{line_no}: each line needs a non-empty string 'prompt'")
        records.append({"prompt": prompt, "workload": record.get("workload", "default")})
    if not records:
        raise ValueError(f"prompt file {path} holds no prompts")
    return records[:limit] if limit else records


def write_prompt_file(records: list[dict], path: Path, *, check: bool = False) -> bool:
    """Write `records` as a jsonl prompt file in one rename (never half-written), or with `check`
    only compare them with the file there; whether the file holds them afterwards."""
    content = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    if check:
        same = path.exists() and path.read_text(encoding="utf-8") == content
        print(f"{path} is {'up to date' if same else 'OUT OF DATE'}")
        return same
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    partial.write_text(content, encoding="utf-8")
    partial.replace(path)
    print(f"wrote {len(records)} prompts to {path}")
    return True

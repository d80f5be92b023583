"""draftsmith's EAGLE-3 head against vLLM speculators' own trainer: same data, same judge.

    bash scripts/speculators_env.sh                 # speculators 0.9 in .venv-speculators
    python benchmarks/peers/speculators_eagle3.py --recipe recipes/smollm2-135m/eagle3.yaml \
        --draftsmith runs/quickstart/drafter \
        --heldout runs/data/smollm2-135m/stdlib-heldout-continued.jsonl \
        --work runs/peers/smollm2-135m --json benchmarks/peers/smollm2-135m.json \
        [recipe overrides key=value ..., as given to the draftsmith run]

1. **Same data.** The recipe's packed training rows (`build_dataset`, the rows draftsmith's
   trainer draws from) are written once with the target's hidden states in the layout
   speculators' offline path reads: per row `hs_<i>.safetensors` holding token_ids (T,) and
   hidden_states (T, 4, H): the recipe's three feature layers and the last decoder layer's
   output before the final norm (speculators applies the verifier's norm itself), float32,
   as draftsmith's trainer sees them online in float32. The draft vocabulary is draftsmith's
   (the most frequent training targets, `build_draft_vocab`), handed over as d2t / t2d.
2. **The peer trains** with `speculators train` under `speculators_cpu.py` (device patches
   only), with the recipe's steps, rows per step (4 rows of 512 = total_seq_len 2048), peak
   learning rate, warm-up and cosine schedule, draft steps (ttt_steps = num_steps), step loss
   decay, forward-KL loss, AdamW without weight decay, norm_before_residual; `norm_before_fc`
   and `norm_output` off (draftsmith's layer computes neither). What its config cannot match
   is listed in the JSON's `differences`.
3. **One judge.** The peer's checkpoint is imported with `draftsmith import` and both artifacts
   are scored by `benchmarks/training/eval_heldout.py` on the held-out continuations: tau_sim
   (k = 1..K) and acceptance by position, teacher-forced as the trainer's evaluation computes
   them.

Training tokens/s: the peer's from its training loop (features read from files); draftsmith's
from the metrics.jsonl of the run that trained `--draftsmith` (with the target in the loop
unless that run used a feature cache). The time to write the peer's feature files is reported
beside them. Every stage skips what `--work` already holds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from draftsmith import __version__
from draftsmith.data.documents import build_dataset
from draftsmith.decoding.profile import device_name
from draftsmith.heads.eagle3 import default_feature_layers
from draftsmith.heads.vocab import build_draft_vocab
from draftsmith.train.config import load_train_config
from draftsmith.train.features import packed_rows
from draftsmith.zoo import fetch_model, load_model

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
EVAL = ROOT / "benchmarks/training/eval_heldout.py"
DIFFERENCES = [
    "AdamW betas: speculators uses torch's (0.9, 0.999); draftsmith's recipe (0.9, 0.95)",
    "data order: each trainer shuffles the same rows with its own sampler and seed",
    "speculators holds out train_data_ratio of the rows for its own validation (0.99 here)",
    "loss mask: speculators trains the prediction from x_t+1 where x_t+1 is a target; "
    "draftsmith where x_t+1 is a target's predecessor (the same except at padding)",
    "gradient clipping at 1.0 in both; speculators' bf16 autocast is off (float32 features)",
]


def prepare(config, work: Path) -> dict:
    """Rows, draft vocabulary and hidden-state files of the recipe's training data."""
    data = work / "data"
    rows_file = work / "rows.safetensors"
    if (data / "done").is_file():
        return json.loads((data / "done").read_text())
    target, tokenizer = load_model(config.target, dtype="float32")
    input_ids, loss_mask = packed_rows(build_dataset(config.data, tokenizer))
    text = target.config.get_text_config()
    layers = tuple(
        config.head_args.feature_layers or default_feature_layers(text.num_hidden_layers)
    )
    counts = torch.bincount(input_ids[loss_mask.bool()].long(), minlength=text.vocab_size)
    d2t, _ = build_draft_vocab(counts, config.head_args.draft_vocab_size)
    t2d = torch.zeros(text.vocab_size, dtype=torch.bool)
    t2d[d2t] = True
    (data / "hidden_states").mkdir(parents=True, exist_ok=True)
    np.save(work / "d2t.npy", (d2t - torch.arange(d2t.numel())).numpy())
    np.save(work / "t2d.npy", t2d.numpy())
    save_file({"input_ids": input_ids, "loss_mask": loss_mask}, str(rows_file))

    last: list[torch.Tensor] = []
    hook = target.model.layers[-1].register_forward_hook(
        lambda _module, _inputs, output: last.append(
            output[0] if isinstance(output, tuple) else output
        )
    )
    start = time.perf_counter()
    with torch.no_grad():
        for i in tqdm(range(input_ids.shape[0]), desc="peer hidden states", unit="row"):
            ids = input_ids[i : i + 1].long()
            out = target(input_ids=ids, output_hidden_states=True, use_cache=False)
            stacked = torch.stack(
                [out.hidden_states[j][0] for j in layers] + [last.pop()[0]], dim=1
            )
            save_file(
                {"token_ids": ids[0], "hidden_states": stacked.contiguous()},
                str(data / "hidden_states" / f"hs_{i}.safetensors"),
            )
    hook.remove()
    summary = {
        "rows": input_ids.shape[0],
        "seq_len": input_ids.shape[1],
        "feature_layers": list(layers),
        "feature_seconds": round(time.perf_counter() - start, 1),
    }
    (data / "done").write_text(json.dumps(summary))
    return summary


def train_peer(config, work: Path, python: str, model_dir: Path, processes: int) -> dict:
    """speculators' EAGLE-3 trainer on the prepared rows, in its own environment."""
    stats_file = work / "peer_stats.json"
    if stats_file.is_file():
        return json.loads(stats_file.read_text())
    args = config.head_args
    rows_per_step = config.batch_size * config.grad_accum * processes
    flags = [
        "--verifier-name-or-path",
        str(model_dir),
        "--speculator-type",
        "eagle3",
        "--data-path",
        str(work / "data"),
        "--save-path",
        str(work / "checkpoints"),
        "--d2t-path",
        str(work / "d2t.npy"),
        "--t2d-path",
        str(work / "t2d.npy"),
        "--draft-vocab-size",
        str(args.draft_vocab_size),
        "--target-layer-ids",
        *[str(i) for i in (args.feature_layers or [])],
        "--total-seq-len",
        str(rows_per_step * config.data.seq_len),
        "--epochs",
        "1",
        "--max-steps",
        str(config.max_steps),
        "--lr",
        str(config.lr),
        "--optimizer",
        "adamw",
        "--weight-decay",
        "0.0",
        "--scheduler-type",
        "cosine",
        "--scheduler-warmup-steps",
        str(config.warmup_steps),
        "--scheduler-total-steps",
        str(config.max_steps),
        "--ttt-steps",
        str(args.num_steps),
        "--ttt-step-loss-decay",
        str(config.objective.step_decay),
        "--loss-fn",
        "kl_div",
        "--loss-implementation",
        "eager",  # the fused one needs Triton (a GPU); eager is its reference, same loss
        "--norm-before-residual" if args.norm_before_residual else "--no-norm-before-residual",
        "--no-norm-before-fc",
        "--no-norm-output",
        "--draft-attn-impl",
        "sdpa",
        "--hidden-states-dtype",
        "float32",
        "--train-data-ratio",
        "0.99",
        "--num-workers",
        "0",
        "--on-missing",
        "raise",
        "--no-resume-from-checkpoint",
        "--seed",
        str(config.seed),
        "--log-dir",
        str(work / "logs"),
    ]
    if not args.feature_layers:
        drop = flags.index("--target-layer-ids")
        del flags[drop : drop + 1]
    command = [
        python,
        str(HERE / "speculators_cpu.py"),
        "--rows",
        str(work / "rows.safetensors"),
        "--stats",
        str(stats_file),
        "--",
        *flags,
    ]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    return json.loads(stats_file.read_text())


def import_peer(config, work: Path) -> Path:
    """The peer's last checkpoint as a draftsmith artifact."""
    artifact = work / "peer-artifact"
    if artifact.is_dir():
        return artifact
    checkpoints = sorted(
        (p for p in (work / "checkpoints").iterdir() if p.is_dir() and p.name.isdigit()),
        key=lambda p: int(p.name),
    )
    if not checkpoints:
        raise SystemExit(f"no checkpoint under {work / 'checkpoints'}: did the peer train?")
    subprocess.run(
        [
            "draftsmith",
            "import",
            str(checkpoints[-1]),
            "--target",
            config.target,
            "--out",
            str(artifact),
            "--dtype",
            "float32",
        ],
        check=True,
    )
    return artifact


def judge(artifact: Path, config, heldout: str) -> dict:
    """Held-out tau_sim and acceptance by position of one artifact (the trainer's evaluation)."""
    out = subprocess.run(
        [
            sys.executable,
            str(EVAL),
            str(artifact),
            "--target",
            config.target,
            "--data",
            heldout,
            "--dtype",
            "float32",
            "--seq-len",
            str(config.eval_data.seq_len),
            "--max-tokens",
            str(config.eval_data.max_tokens),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def draftsmith_speed(artifact: Path) -> dict:
    """Steps and median training tokens/s of the run that wrote `artifact` (its metrics.jsonl)."""
    metrics = artifact.parent / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    rates = sorted(r["tokens_per_s"] for r in records if r.get("tokens_per_s"))
    steps = max(r.get("step", 0) for r in records)
    return {"steps": steps, "train_tokens_per_s": rates[len(rates) // 2] if rates else None}


def row(scores: dict, steps: int, tokens_per_s: float | None) -> dict:
    tau = scores["tau_sim"]
    return {
        "steps": steps,
        "tau_sim_4": tau[3] if len(tau) >= 4 else None,
        "tau_sim": tau,
        "acceptance": scores["acceptance"],
        "top1": scores["top1"],
        "train_tokens_per_s": tokens_per_s,
        "positions": scores.get("positions"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", required=True)
    parser.add_argument(
        "--draftsmith", type=Path, required=True, help="the recipe's trained artifact"
    )
    parser.add_argument("--heldout", required=True, help="held-out continuations to judge on")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument(
        "--python",
        default=os.environ.get("SPECULATORS_PYTHON", str(ROOT / ".venv-speculators/bin/python")),
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=2,
        help="processes of the draftsmith run (rows per step = batch_size x this)",
    )
    parser.add_argument("overrides", nargs="*", help="recipe key=value overrides")
    args = parser.parse_args()
    config = load_train_config(args.recipe, args.overrides)
    args.work.mkdir(parents=True, exist_ok=True)
    prepared = prepare(config, args.work)
    peer_stats = train_peer(
        config, args.work, args.python, Path(fetch_model(config.target)), args.processes
    )
    peer = import_peer(config, args.work)
    ours = draftsmith_speed(args.draftsmith)
    report = {
        "target": config.target,
        "recipe": args.recipe,
        "overrides": args.overrides,
        "heldout": args.heldout,
        "data": prepared,
        "draftsmith": row(
            judge(args.draftsmith, config, args.heldout), ours["steps"], ours["train_tokens_per_s"]
        ),
        "speculators": row(
            judge(peer, config, args.heldout), peer_stats["steps"], peer_stats["tokens_per_s"]
        ),
        "speculators_version": "0.9.0",
        "draftsmith_version": __version__,
        "hardware": device_name(torch.device("cpu")),
        "date": time.strftime("%Y-%m-%d"),
        "differences": DIFFERENCES,
        "command": " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: report[k] for k in ("draftsmith", "speculators")}, indent=2))


if __name__ == "__main__":
    main()

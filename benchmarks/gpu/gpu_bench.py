"""The prepared GPU benchmark (issue 14): a random-weight target of Llama-3.1-8B's shape in
bf16, an EAGLE-3 head of that shape, and three measurements:

1. the verify-cost curve: one target forward of n = 1..64 new tokens after a KV cache of
   `--context` positions (`draftsmith.decoding.profile.profile_target`);
2. decode step times: seconds per draft-and-verify round of `SpeculativeDecoder` with the head
   drafting chains and trees of fixed shapes (random weights accept next to nothing, so a round
   is one draft plus one verification of the whole draft: the step cost, not a speed-up);
3. EAGLE-3 training tokens/s with online features: the trainer's step (frozen target forward
   for the features and logits, the head's K steps, the objective, backward, clipping, AdamW)
   under bf16 autocast, on random token rows.

    python benchmarks/gpu/gpu_bench.py --json out.json           # needs a CUDA device
    python benchmarks/gpu/gpu_bench.py --tiny --json out.json    # a tiny shape, on the CPU

Nothing is downloaded: the weights are random, built on the device. Writes one JSON and prints
a table. `benchmarks/gpu/run.sh` runs it with a time limit.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import statistics
import time
from datetime import datetime, timezone
from importlib.metadata import version
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from draftsmith import FixedPolicy, SpeculativeDecoder
from draftsmith.decoding.profile import profile_drafter, profile_target
from draftsmith.heads import TreeShape, build_head, fit_draft_vocab
from draftsmith.train.features import OnlineFeatures
from draftsmith.train.head_objective import HeadObjective
from draftsmith.train.objectives import ObjectiveConfig

LLAMA_31_8B = dict(
    vocab_size=128256,
    hidden_size=4096,
    intermediate_size=14336,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=8,
    max_position_embeddings=131072,
    rope_theta=500000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=False,
)
TINY = dict(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)
HEAD_ARGS = {"num_steps": 7, "draft_vocab_size": 32000}
"""recipes/llama-3.1-8b-instruct/eagle3.yaml's head."""
TINY_HEAD_ARGS = {"num_steps": 3, "draft_vocab_size": 128}
DECODE_SHAPES = {
    "chain-1": {"max_draft_tokens": 1},
    "chain-4": {"max_draft_tokens": 4},
    "chain-8": {"max_draft_tokens": 8},
    "tree-4x4-16": {"tree": TreeShape(top_k=4, depth=4, total_tokens=16)},
    "tree-8x6-32": {"tree": TreeShape(top_k=8, depth=6, total_tokens=32)},
    "tree-10x7-60": {"tree": TreeShape(top_k=10, depth=7, total_tokens=60)},
}
"""Fixed draft shapes; tree-10x7-60 is EAGLE-3's published default (top-k 10, depth 7, 60)."""


def build_target(tiny: bool, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    """A random-weight Llama of the 8B shape (or the tiny one), built on `device`, eval mode."""
    config = LlamaConfig(**(TINY if tiny else LLAMA_31_8B), attn_implementation="sdpa")
    torch.manual_seed(0)
    with torch.device(device):  # initialised in place, in `dtype`: no float32 copy of 8B
        model = LlamaForCausalLM._from_config(config, dtype=dtype)
    return model.eval().requires_grad_(False)


def build_eagle3(target: LlamaForCausalLM, tiny: bool, rows: torch.Tensor):
    """An EAGLE-3 head of the target's shape, its draft vocabulary fitted to `rows` (N, T) as
    the trainer does: float32 master weights on the target's device."""
    with target.device:  # built where it runs: a CPU initialisation of 0.5 B weights is slow
        head = build_head("eagle3", target, TINY_HEAD_ARGS if tiny else HEAD_ARGS)
    fit_draft_vocab(head, rows, torch.ones_like(rows), target.config.vocab_size)
    return head.to(target.device)


def inference_copy(target, head, tiny: bool):
    """The head in the target's precision for decoding, as `load_drafter` gives it."""
    with target.device:
        copy = build_head("eagle3", target, TINY_HEAD_ARGS if tiny else HEAD_ARGS)
    copy.load_state_dict(head.state_dict())
    return copy.to(device=target.device, dtype=target.dtype).eval()


def decode_steps(target, drafter_head, args, generator: torch.Generator) -> dict[str, dict]:
    """Seconds per draft-and-verify round for each fixed draft shape: the median gap between
    consecutive rounds (timestamped by the decoder's round hook) over `--rounds` rounds whose
    draft had the shape's full size. The generation runs long enough that the budget left never
    cuts a timed round's draft (the decoder drafts no more than the tokens still wanted)."""
    vocab = target.config.vocab_size
    prompt = torch.randint(vocab, (args.context,), generator=generator)
    results = {}
    for name, shape in DECODE_SHAPES.items():
        decoder = SpeculativeDecoder(
            target, drafter_head.as_drafter(target), policy=FixedPolicy(**shape)
        )
        decoder.generate(prompt, max_new_tokens=4)  # warm-up
        size = shape["tree"].max_tokens if "tree" in shape else shape["max_draft_tokens"]
        stamps: list[tuple[float, int]] = []

        def stamp(record, stamps=stamps) -> None:
            synchronize(target.device)
            stamps.append((time.perf_counter(), len(record.draft)))

        # Random weights accept next to nothing: about a token a round, so this many tokens
        # give `rounds` full-size rounds (fewer, reported, should drafts be accepted).
        decoder.generate(prompt, max_new_tokens=2 * args.rounds + size + 2, on_round=stamp)
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(stamps[1:]) if b[1] == size]
        gaps = gaps[: args.rounds]
        step_s = statistics.median(gaps)
        results[name] = {"step_s": step_s, "draft_tokens": size, "rounds_timed": len(gaps)}
        print(f"  decode {name}: {step_s * 1e3:.2f} ms/round ({len(gaps)} rounds)", flush=True)
    return results


def training_throughput(target, head, args, generator: torch.Generator) -> dict:
    """Tokens/s of the trainer's step on random rows: online features (frozen target forward),
    the head's objective, backward, clipping and AdamW, under bf16 autocast on a GPU."""
    vocab = target.config.vocab_size
    rows = args.batch_size * (args.train_steps + args.train_warmup)
    ids = torch.randint(vocab, (rows, args.seq_len), generator=generator, dtype=torch.int32)
    mask = torch.ones_like(ids, dtype=torch.int8)
    source = OnlineFeatures(target, tuple(head.target_feature_layers), ids, mask)
    head.fit_to_sample(source.batch(torch.arange(min(rows, 8)), target.device))
    objective = HeadObjective(head, ObjectiveConfig()).train()
    optimizer = torch.optim.AdamW([p for p in objective.parameters() if p.requires_grad], lr=1e-4)
    device = target.device
    autocast = torch.autocast(device.type, torch.bfloat16, enabled=device.type == "cuda")
    times = []
    for step in range(args.train_warmup + args.train_steps):
        batch_rows = torch.arange(step * args.batch_size, (step + 1) * args.batch_size)
        synchronize(device)
        started = time.perf_counter()
        batch = source.batch(batch_rows, device)
        with autocast:
            loss = objective(batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(objective.parameters(), 0.5)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        synchronize(device)
        if step >= args.train_warmup:
            times.append(time.perf_counter() - started)
        print(f"  train step {step}: {time.perf_counter() - started:.3f} s", flush=True)
    step_s = sorted(times)[len(times) // 2]
    return {
        "tokens_per_s": args.batch_size * args.seq_len / step_s,
        "step_s_median": step_s,
        "batch_size": args.batch_size,
        "seq_len": args.seq_len,
        "steps_timed": len(times),
        "peak_memory_gib": peak_memory_gib(device),
    }


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def print_table(result: dict) -> None:
    curve = result["verify_curve"]
    print(f"\n{result['shape']} {result['dtype']} on {result['device_name']}")
    print(f"verify cost after {curve['context']} cached positions (ms):")
    for n, s in zip(curve["tokens"], curve["verify_s"], strict=True):
        if n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 64):
            print(f"  {n:>3} tokens  {s * 1e3:8.2f}   ({s / curve['verify_s'][0]:.2f}x one token)")
    print(f"EAGLE-3 draft step: {result['draft_step_s'] * 1e3:.2f} ms")
    print("decode round (draft + verify), ms:")
    for name, row in result["decode"].items():
        print(
            f"  {name:<14} {row['step_s'] * 1e3:8.2f}   "
            f"({row['draft_tokens']} draft tokens a round)"
        )
    train = result["train"]
    print(
        f"EAGLE-3 training, online features: {train['tokens_per_s']:,.0f} tokens/s "
        f"(batch {train['batch_size']} x {train['seq_len']}, {train['step_s_median']:.3f} s/step)"
    )
    print(f"total {result['wall_s']:.0f} s")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny shape in float32 (CPU check)")
    parser.add_argument("--json", type=Path, required=True, help="where to write the results")
    parser.add_argument("--device", default=None, help="default: cuda, or cpu with --tiny")
    parser.add_argument("--context", type=int, default=None, help="cached positions (1024)")
    parser.add_argument("--rounds", type=int, default=24, help="timed decode rounds per shape")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per curve point")
    parser.add_argument("--seq-len", type=int, default=None, help="training rows (2048)")
    parser.add_argument("--batch-size", type=int, default=2, help="training rows per step")
    parser.add_argument("--train-steps", type=int, default=6, help="timed training steps")
    parser.add_argument("--train-warmup", type=int, default=2, help="untimed training steps")
    args = parser.parse_args(argv)
    device = torch.device(args.device or ("cpu" if args.tiny else "cuda"))
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: run with --tiny for the CPU check")
    dtype = torch.float32 if args.tiny else torch.bfloat16
    args.context = args.context or (64 if args.tiny else 1024)
    args.seq_len = args.seq_len or (64 if args.tiny else 2048)

    started = time.perf_counter()
    result = {
        "shape": "tiny" if args.tiny else "Llama-3.1-8B (random weights)",
        "target_config": TINY if args.tiny else LLAMA_31_8B,
        "head_args": TINY_HEAD_ARGS if args.tiny else HEAD_ARGS,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "versions": {p: version(p) for p in ("draftsmith", "torch", "transformers")},
        "python": platform.python_version(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }

    def save(**measured) -> None:
        """Add `measured` and rewrite the JSON: a run stopped by the time limit keeps what it
        measured so far."""
        result.update(measured, wall_s=time.perf_counter() - started)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")

    generator = torch.Generator().manual_seed(0)
    target = build_target(args.tiny, device, dtype)
    print(f"target built: {sum(p.numel() for p in target.parameters()) / 1e9:.2f} B parameters")
    rows = torch.randint(target.config.vocab_size, (16, 256), generator=generator)
    head = build_eagle3(target, args.tiny, rows)

    print("verify-cost curve ...", flush=True)
    curve = profile_target(
        target, context=args.context, repeats=args.repeats, sizes=range(1, 65), name="random"
    )
    save(
        verify_curve={"tokens": curve.tokens, "verify_s": curve.verify_s, "context": curve.context}
    )
    print("decode steps ...", flush=True)
    drafter_head = inference_copy(target, head, args.tiny)
    prompt = torch.randint(target.config.vocab_size, (args.context,), generator=generator)
    width = len(head.target_feature_layers) * target.config.hidden_size
    features = torch.randn(args.context - 1, width, generator=generator).to(device, dtype)
    drafter = drafter_head.as_drafter(target)
    save(draft_step_s=profile_drafter(drafter, prompt.to(device), features, args.repeats))
    save(decode=decode_steps(target, drafter_head, args, generator))
    del drafter, drafter_head
    print("training ...", flush=True)
    save(train=training_throughput(target, head, args, generator))
    print_table(result)
    print(f"results written to {args.json}")
    return result


if __name__ == "__main__":
    main()

"""Stream calibration under workload shift: how well raw top-1, an artifact's offline calibration
and online recalibration (`draftsmith.decoding.online.OnlineAcceptance`) predict what the target
accepts while decoding prompts of other workloads.

    python benchmarks/calibration/stream_calibration.py --target NAME --drafter artifact:DIR \
        --prompts A.jsonl [B.jsonl ...] [--dtype float32] [--max-new-tokens 96] \
        [--draft-tokens 4] [--prior-strength S] [--forgetting F] [--burn-in 50] \
        [--sweep] [--json OUT.json]

Every prompt is decoded greedily with a chain of --draft-tokens; each round's verification
labels the drafted top-1 tokens it judged (`round_outcomes`). Per workload (the records'
"workload" field), in prompt order, every observed token gets three predictions made before its
round is observed: raw top1_prob, the artifact's calibrator, and one `OnlineAcceptance` per
workload that continues across the workload's prompts and is updated after each round (and,
as "online_shared", the same model with one correction for every token, as it was before it
corrected a round's first token apart from the later ones). The chain policy never reads the
acceptance model, so the online model is replayed over the recorded rounds in order after
decoding: the same predictions as updating it inside the loop.

Reports per workload: observations, acceptance rate, and per predictor the mean prediction and
equal-mass ECE (15 bins), over the whole stream and over observations after the first
--burn-in, and after burn-in apart for each round's first token and the tokens after it.
--sweep also replays a grid of (prior strength, forgetting), the data to choose the defaults on
(do that on prompts the report does not use).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from draftsmith.build.drafters import build_drafter
from draftsmith.calibration.metrics import ece, ece_debiased, nll
from draftsmith.core.signals import AcceptanceModel
from draftsmith.decoding import FixedPolicy, RoundRecord, SpeculativeDecoder
from draftsmith.decoding.online import CORRECTION_GROUPS, OnlineAcceptance, round_outcomes
from draftsmith.evaluation.prompts import load_prompts
from draftsmith.zoo import load_model

Round = tuple[dict[str, torch.Tensor], torch.Tensor]
"""One round's observed tokens: their signals (each (m,)) and outcomes (m,)."""

N_BINS = 15
SWEEP_PRIOR = (1.0, 3.0, 10.0, 30.0, 100.0)
SWEEP_FORGETTING = (0.98, 0.99, 0.995, 0.998, 0.999, 1.0)


def main() -> None:
    args = parse_args()
    prompts = [record for path in args.prompts for record in load_prompts(path)]
    target, tokenizer = load_model(args.target, dtype=args.dtype)
    built = build_drafter(args.drafter, target, tokenizer, dtype=args.dtype)
    if built.acceptance is None:
        print("the drafter has no calibration: 'offline' is the raw top-1 probability")
    if args.load_streams:
        streams = load_streams(args.load_streams)
    else:
        policy = FixedPolicy(max_draft_tokens=args.draft_tokens, recalibrate=False)
        decoder = SpeculativeDecoder(target, built.drafter, tokenizer, policy=policy)
        streams = decode(decoder, prompts, args.max_new_tokens)
    if args.save_streams:
        save_streams(streams, args.save_streams)

    report = {
        "command": " ".join(["python", *sys.argv]),
        "torch_threads": torch.get_num_threads(),
        "online": {"prior_strength": args.prior_strength, "forgetting": args.forgetting},
        "burn_in": args.burn_in,
        "workloads": {},
    }
    for workload, rounds in streams.items():
        online = OnlineAcceptance(
            built.acceptance, prior_strength=args.prior_strength, forgetting=args.forgetting
        )
        report["workloads"][workload] = summarise(rounds, built.acceptance, online, args.burn_in)
        if args.sweep:
            report["workloads"][workload]["sweep"] = sweep(rounds, built.acceptance, args.burn_in)
    print_table(report)
    if args.json:
        with open(args.json, "w") as out:
            out.write(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.json}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--drafter", required=True, help="artifact:DIR (or any drafter spec)")
    parser.add_argument(
        "--prompts", nargs="+", required=True, help='jsonl of {"prompt", "workload"}'
    )
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--draft-tokens", type=int, default=4, help="the chain's length")
    defaults = OnlineAcceptance()
    parser.add_argument("--prior-strength", type=float, default=defaults.prior_strength)
    parser.add_argument("--forgetting", type=float, default=defaults.forgetting)
    parser.add_argument("--burn-in", type=int, default=50, help="observations before 'after'")
    parser.add_argument("--sweep", action="store_true", help="replay a grid of online settings")
    parser.add_argument("--json")
    parser.add_argument("--save-streams", help="save the observed rounds (safetensors) to replay")
    parser.add_argument(
        "--load-streams", help="replay rounds saved by --save-streams instead of decoding"
    )
    return parser.parse_args()


def decode(
    decoder: SpeculativeDecoder, prompts: list[dict], max_new_tokens: int
) -> dict[str, list[Round]]:
    """Every prompt decoded greedily; the observed rounds per workload, in prompt order."""
    streams: dict[str, list[Round]] = defaultdict(list)
    for record in tqdm(prompts, desc="decoding", unit="prompt"):
        rounds = streams[record["workload"]]

        def observe(round_: RoundRecord, rounds: list[Round] = rounds) -> None:
            if len(round_.draft):
                rounds.append(round_outcomes(round_.draft, round_.accepted_path))

        decoder.generate(record["prompt"], max_new_tokens=max_new_tokens, on_round=observe)
    return dict(streams)


def save_streams(streams: dict[str, list[Round]], path: str) -> None:
    """Every workload's rounds in one safetensors file: tensor WORKLOAD/ROUND/NAME (a signal, or
    `accepted`), the workloads' order in the metadata."""
    tensors = {
        f"{workload}/{i:06d}/{name}": value.contiguous()
        for workload, rounds in streams.items()
        for i, (signals, accepted) in enumerate(rounds)
        for name, value in {**signals, "accepted": accepted}.items()
    }
    save_file(tensors, path, metadata={"workloads": json.dumps(list(streams))})


def load_streams(path: str) -> dict[str, list[Round]]:
    """The streams `save_streams` wrote, in their order."""
    with safe_open(path, framework="pt") as saved:
        workloads = json.loads(saved.metadata()["workloads"])
        rounds: dict[str, dict[str, dict[str, torch.Tensor]]] = {w: {} for w in workloads}
        names = saved.keys()  # a safetensors file is not iterable
        for key in names:
            workload, index, name = key.rsplit("/", 2)
            rounds[workload].setdefault(index, {})[name] = saved.get_tensor(key)
    return {
        workload: [(tensors, tensors.pop("accepted")) for _, tensors in sorted(by_index.items())]
        for workload, by_index in rounds.items()
    }


def replay(rounds: list[Round], online: OnlineAcceptance) -> tuple[np.ndarray, float]:
    """The online model's predictions (n,), each made before its round was observed, and the
    mean seconds per round of predicting and observing."""
    predictions = []
    started = time.perf_counter()
    for signals, accepted in rounds:
        predictions.append(online.predict_signals(signals).numpy())
        online.observe(signals, accepted)
    return np.concatenate(predictions), (time.perf_counter() - started) / len(rounds)


def summarise(
    rounds: list[Round], offline: AcceptanceModel | None, online: OnlineAcceptance, burn_in: int
) -> dict:
    outcomes = torch.cat([accepted for _, accepted in rounds]).numpy()
    raw = torch.cat([signals["top1_prob"] for signals, _ in rounds]).numpy()
    started = time.perf_counter()
    predictions = {"raw": raw, "offline": offline_predictions(rounds, offline)}
    offline_s = (time.perf_counter() - started) / len(rounds)
    predictions["online"], online_s = replay(rounds, online)
    shared = OnlineAcceptance(
        online.offline,
        prior_strength=online.prior_strength,
        forgetting=online.forgetting,
        split_on=(),
    )
    predictions["online_shared"], _ = replay(rounds, shared)
    after = slice(burn_in, None)
    first = torch.cat([signals["position"] for signals, _ in rounds]).numpy() == 0
    return {
        "observations": int(outcomes.size),
        "rounds": len(rounds),
        "accepted_rate": float(outcomes.mean()),
        "accepted_rate_after_burn_in": float(outcomes[after].mean()),
        "offline_ms_per_round": 1e3 * offline_s,
        "online_ms_per_round": 1e3 * online_s,
        "online_params": {
            group: {"a": c.mean[0], "b": c.mean[1], "observed": c.n_observed}
            for group, c in zip(CORRECTION_GROUPS, online.corrections, strict=True)
        },
        "ece_noise_floor_after_burn_in": noise_floor(predictions["online"][after]),
        **{name: scores(conf, outcomes, after, first) for name, conf in predictions.items()},
    }


def scores(
    conf: np.ndarray, outcomes: np.ndarray, after: slice, first: np.ndarray
) -> dict[str, float]:
    by_position = {}
    for name, mask in (("first", first), ("later", ~first)):
        mask = mask.copy()
        mask[: after.start] = False
        by_position[f"{name}_after_burn_in"] = {
            "observations": int(mask.sum()),
            "accepted_rate": float(outcomes[mask].mean()) if mask.any() else float("nan"),
            "mean_predicted": float(conf[mask].mean()) if mask.any() else float("nan"),
            "ece": _ece(conf[mask], outcomes[mask]),
            "nll": nll(conf[mask], outcomes[mask]) if mask.any() else float("nan"),
        }
    return {
        **by_position,
        "mean_predicted": float(conf.mean()),
        "ece": _ece(conf, outcomes),
        "mean_predicted_after_burn_in": float(conf[after].mean()),
        "ece_after_burn_in": _ece(conf[after], outcomes[after]),
        "ece_debiased_after_burn_in": ece_debiased(conf[after], outcomes[after], N_BINS),
        "nll_after_burn_in": nll(conf[after], outcomes[after]),
    }


def offline_predictions(rounds: list[Round], offline: AcceptanceModel | None) -> np.ndarray:
    """The offline model's predictions (n,) (raw top1_prob without one)."""
    if offline is None:
        return torch.cat([signals["top1_prob"] for signals, _ in rounds]).numpy()
    return torch.cat([offline.predict_signals(signals) for signals, _ in rounds]).numpy()


def noise_floor(conf: np.ndarray, draws: int = 200) -> float:
    """The mean equal-mass ECE of a perfectly calibrated predictor with these predictions (n,):
    outcomes drawn from them. An ECE near it is as good as n outcomes can show."""
    rng = np.random.default_rng(0)
    return float(np.mean([_ece(conf, rng.random(conf.size) < conf) for _ in range(draws)]))


def sweep(rounds: list[Round], offline: AcceptanceModel | None, burn_in: int) -> list[dict]:
    """Online ECE (whole stream and after burn-in) for every setting of the grid."""
    outcomes = torch.cat([accepted for _, accepted in rounds]).numpy()
    rows = []
    for prior, forgetting in itertools.product(SWEEP_PRIOR, SWEEP_FORGETTING):
        online = OnlineAcceptance(offline, prior_strength=prior, forgetting=forgetting)
        conf, _ = replay(rounds, online)
        rows.append(
            {
                "prior_strength": prior,
                "forgetting": forgetting,
                "ece": _ece(conf, outcomes),
                "ece_after_burn_in": _ece(conf[burn_in:], outcomes[burn_in:]),
                "nll_after_burn_in": nll(conf[burn_in:], outcomes[burn_in:]),
            }
        )
    return rows


def _ece(conf: np.ndarray, outcomes: np.ndarray) -> float:
    return ece(conf, outcomes, n_bins=N_BINS, binning="equal_mass") if conf.size else float("nan")


def print_table(report: dict) -> None:
    predictors = ("raw", "offline", "online_shared", "online")
    print(
        f"\n{'workload':<26} {'n':>5} {'accept':>6} | mean predicted raw/offline/shared/online "
        f"| ECE raw/offline/shared/online | after {report['burn_in']} obs: ECE "
        "raw/offline/shared/online, floor"
    )
    for name, w in report["workloads"].items():
        means = "/".join(f"{w[p]['mean_predicted']:.3f}" for p in predictors)
        eces = "/".join(f"{w[p]['ece']:.3f}" for p in predictors)
        later = "/".join(f"{w[p]['ece_after_burn_in']:.3f}" for p in predictors)
        floor = w["ece_noise_floor_after_burn_in"]
        print(
            f"{name:<26} {w['observations']:>5} {w['accepted_rate']:>6.3f} | {means:^33} | "
            f"{eces:^22} | {later}, {floor:.3f}"
        )
        for group in ("first", "later"):
            key = f"{group}_after_burn_in"
            cells = ", ".join(
                f"{p} {w[p][key]['mean_predicted']:.3f} ece {w[p][key]['ece']:.3f} "
                f"nll {w[p][key]['nll']:.4f}"
                for p in predictors
            )
            n, rate = w["online"][key]["observations"], w["online"][key]["accepted_rate"]
            print(f"    {group:<6} {n:>5} accepted {rate:.3f}: {cells}")
    if any("sweep" in w for w in report["workloads"].values()):
        print_sweep(report["workloads"])


def print_sweep(workloads: dict) -> None:
    """Online ECE after burn-in per grid setting: per workload and the mean over workloads."""
    names = [n for n, w in workloads.items() if "sweep" in w]
    print(f"\n{'prior':>6} {'forget':>6} " + " ".join(f"{n[:10]:>10}" for n in names) + "   mean")
    for i, row in enumerate(workloads[names[0]]["sweep"]):
        values = [workloads[n]["sweep"][i]["ece_after_burn_in"] for n in names]
        cells = " ".join(f"{v:>10.3f}" for v in values)
        print(
            f"{row['prior_strength']:>6g} {row['forgetting']:>6g} {cells} {np.mean(values):>6.3f}"
        )


if __name__ == "__main__":
    main()

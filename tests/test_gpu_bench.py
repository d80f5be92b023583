"""benchmarks/gpu/gpu_bench.py runs end to end at its --tiny shape on the CPU, so the GPU run
(no GPU here) meets a script known to work."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks/gpu/gpu_bench.py"


def test_the_gpu_benchmark_runs_at_the_tiny_shape(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("gpu_bench", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "tiny.json"
    bench.main(["--tiny", "--json", str(out), "--repeats", "1", "--rounds", "3",
                "--train-steps", "1", "--train-warmup", "1"])  # fmt: skip
    result = json.loads(out.read_text())
    curve = result["verify_curve"]
    assert curve["tokens"] == list(range(1, 65)) and len(curve["verify_s"]) == 64
    assert all(b >= a > 0 for a, b in itertools.pairwise(curve["verify_s"]))
    assert set(result["decode"]) == set(bench.DECODE_SHAPES)
    assert all(row["step_s"] > 0 and row["rounds_timed"] > 0 for row in result["decode"].values())
    assert result["train"]["tokens_per_s"] > 0 and result["draft_step_s"] >= 0
    assert "EAGLE-3 training, online features" in capsys.readouterr().out

"""`draftsmith bench` under a virtual clock, for before/after comparisons of the default policy.

The cost-aware policy plans from timings (the stored cost curve, each round's drafting and
verification), so two runs of one version on a real clock already differ in tau. Here
`time.perf_counter` is replaced, before draftsmith is imported, by a counter that advances only
when a decoder layer runs: by a fixed cost a call plus a cost a token scaled by the layer's
width squared (the target's and draft model's transformers layers, the EAGLE-3 head's layer
with a larger fixed cost standing in for its own LM head). Every decision then depends on the
work done alone, so two versions whose policies behave alike give identical draft sizes, tau and
acceptance by position, and identical virtual tokens per second. Whichever draftsmith is first
on the path runs (an older one by PYTHONPATH); give each version its own DRAFTSMITH_HOME so each
measures its own cost curve on the virtual clock.

    PYTHONPATH=OLD_SITE DRAFTSMITH_HOME=/tmp/old python benchmarks/policies/virtual_clock_bench.py \\
        bench --target smollm2-135m --drafter artifact:runs/quickstart/drafter --dtype float32 \\
        --limit 4 --json old.json
"""

import sys
import time


class VirtualClock:
    now = 0.0


def perf_counter() -> float:
    return VirtualClock.now


time.perf_counter = perf_counter  # before any module binds the real one

from transformers.models.llama import modeling_llama  # noqa: E402
from transformers.models.qwen2 import modeling_qwen2  # noqa: E402

from draftsmith.commands.cli import main  # noqa: E402
from draftsmith.heads import eagle3  # noqa: E402

LAYER_CALL_S = 100e-6
TOKEN_S_AT_576 = 40e-6  # a token through a layer 576 wide (SmolLM2-135M's)
HEAD_CALL_S = 1e-3


def advance_on_forward(layer_class: type, call_s: float) -> None:
    """Make each forward of `layer_class` advance the clock by `call_s` plus its tokens' cost."""
    forward = layer_class.forward

    def timed(self, *args, **kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        width = self.mlp.gate_proj.in_features
        tokens = hidden.shape[0] * hidden.shape[1]
        VirtualClock.now += call_s + tokens * TOKEN_S_AT_576 * (width / 576) ** 2
        return forward(self, *args, **kwargs)

    layer_class.forward = timed


if __name__ == "__main__":
    advance_on_forward(modeling_llama.LlamaDecoderLayer, LAYER_CALL_S)
    advance_on_forward(modeling_qwen2.Qwen2DecoderLayer, LAYER_CALL_S)
    advance_on_forward(eagle3.Eagle3DecoderLayer, HEAD_CALL_S)
    main(sys.argv[1:])
    print(f"virtual seconds: {VirtualClock.now:.6f}")

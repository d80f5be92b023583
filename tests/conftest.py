"""Tiny random targets and hand-written drafters shared by the tests."""

from __future__ import annotations

import importlib
import os

# Tests never reach the Hugging Face hub (nor probe it, `draftsmith.core.hub`): set before the
# hub client is imported, which reads it once.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import torch
from transformers import (
    DynamicCache,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PretrainedConfig,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from draftsmith.core.sampling import probabilities
from draftsmith.heads.base import Draft, Drafter

torch.set_num_threads(2)

TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    # A wide init gives peaked, far-from-tied logits, so float32 identity tests are meaningful.
    initializer_range=0.2,
    bos_token_id=0,
    eos_token_id=None,
    pad_token_id=None,
)


def tiny_model(arch: str = "llama", seed: int = 0, **overrides) -> LlamaForCausalLM:
    """A 2-layer random causal LM (float32, eval mode) from a real transformers config class."""
    config_cls, model_cls = {
        "llama": (LlamaConfig, LlamaForCausalLM),
        "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    }[arch]
    torch.manual_seed(seed)
    model = model_cls(config_cls(**{**TINY, **overrides})).eval()
    model.generation_config = GenerationConfig(eos_token_id=None, pad_token_id=0)
    return model


def perturbed_copy(model, scale: float, seed: int = 1):
    """A copy of model with Gaussian noise on its weights: a draft model that agrees partly."""
    copy = type(model)(model.config).eval()
    copy.load_state_dict(model.state_dict())
    copy.generation_config = model.generation_config
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * scale * p.std().clamp_min(1e-3))
    return copy


def greedy_reference(model, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
    """The target's own greedy continuation via Hugging Face generate."""
    out = model.generate(
        prompt[None], do_sample=False, max_new_tokens=max_new_tokens, attention_mask=None
    )
    return out[0, prompt.numel() :].tolist()


@pytest.fixture(scope="session")
def llama():
    return tiny_model("llama", seed=0)


@pytest.fixture(scope="session")
def qwen2():
    return tiny_model("qwen2", seed=3)


class Clock:
    """Stands in for time.perf_counter: every reading is `tick` s after the one before, so
    timings (and what a policy decides from them) are the same in every run."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


class MarkovTarget(torch.nn.Module):
    """A hand-written target: the next-token logits depend only on the previous token.

    It quacks like a transformers causal LM for the decoder (logits, a growing DynamicCache),
    and its exact sequence probabilities make distribution tests precise.
    """

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table  # (V, V) logits of the next token given the previous one
        self.config = PretrainedConfig(vocab_size=table.shape[0], max_position_embeddings=64)
        # Attention is trivial here (the logits read one token), so a tree mask holds as given.
        self.config._attn_implementation = "eager"
        self.generation_config = GenerationConfig(eos_token_id=None)
        self.dtype = torch.float32

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def forward(self, input_ids, cache: DynamicCache, use_cache=True, **_):
        n = input_ids.shape[1]
        dummy = torch.zeros(input_ids.shape[0], 1, n, 1)
        cache.update(dummy, dummy, layer_idx=0)
        return _Output(logits=self.table[input_ids])


class _Output:
    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits
        self.hidden_states = None


class TableDrafter(Drafter):
    """Drafts from hand-written per-position logits (k, V), sampling from them under sampling."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits
        self.vocab_size = logits.shape[-1]

    def start(self, prompt_ids, target_features=None) -> None:
        pass

    def draft(self, request) -> Draft:
        logits, sampling = self.logits[: request.shape.depth], request.sampling
        probs = probabilities(logits, sampling)
        if sampling.greedy:
            tokens = logits.argmax(-1)
        else:
            tokens = torch.multinomial(probs, 1, generator=request.generator)[:, 0]
        return Draft(tokens=tokens, probs=None if sampling.greedy else probs, logits=logits)

    def commit(self, tokens, target_features=None) -> None:
        pass


class OracleDrafter(Drafter):
    """Greedy stub that knows the target's greedy continuation and gets the first j draft tokens
    of every round right, then proposes a wrong token: accept-all, reject-all, accept-first-j."""

    def __init__(self, reference: list[int], vocab_size: int, correct: int) -> None:
        self.reference = reference
        self.vocab_size = vocab_size
        self.correct = correct
        self.committed = 0

    def start(self, prompt_ids, target_features=None) -> None:
        self.committed = 0

    def draft(self, request) -> Draft:
        upcoming = self.reference[self.committed : self.committed + request.shape.depth]
        tokens = [
            t if i < self.correct else (t + 1) % self.vocab_size for i, t in enumerate(upcoming)
        ]
        return Draft(tokens=torch.tensor(tokens, dtype=torch.long))

    def commit(self, tokens, target_features=None) -> None:
        self.committed += tokens.numel()


@pytest.fixture(scope="session")
def byte_tokenizer():
    """A byte-level tokenizer with 256 ids (no merges), matching the tiny models' vocabulary."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from intra-op threads, and on a shared machine the hand-offs
    between threads cost more than the arithmetic."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def own_home(request, tmp_path_factory, monkeypatch):
    """What the code under test stores in the draftsmith home (cost curves, data) goes to a
    temporary one, not the user's; `slow` tests keep the real home, where the zoo's models are."""
    if request.node.get_closest_marker("slow") is None:
        monkeypatch.setenv("DRAFTSMITH_HOME", str(tmp_path_factory.mktemp("home")))


@pytest.fixture(autouse=True)
def stored_cost_curves_hold(request, monkeypatch):
    """A stored cost curve is reused as stored: whether it was timed while the machine was busy
    is a timing, so only tests marked `busy_check` (with an injected profile) reach that rule."""
    if request.node.get_closest_marker("busy_check") is None:
        module = importlib.import_module("draftsmith.build.cost_curve")  # the package's
        monkeypatch.setattr(module, "timed_while_busy", lambda *_: None)  # cost_curve is a function


@pytest.fixture(autouse=True)
def cpu_without_bf16_units(monkeypatch):
    """dtype auto resolves as on a CPU without bf16 matrix units (float32, the tiny models' own
    precision) whatever this machine has, so no test depends on it; a test fakes units itself."""
    monkeypatch.setattr("draftsmith.core.models.bf16_matrix_units", lambda: [])

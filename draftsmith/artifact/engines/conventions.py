"""Where draftsmith and the serving engines differ on the same EAGLE-3 / Medusa weights.

- Draft vocabulary. draftsmith: `d2t[i]` is the target id of draft id i, `t2d[t]` the draft id of
  target id t or -1. The EAGLE repository, speculators, vLLM and SGLang: `d2t[i]` is an offset
  (target id = i + d2t[i]) and `t2d` a boolean mask over the target vocabulary.
- Feature layers. draftsmith names them by index into transformers' `hidden_states` (0: the
  embeddings, k: the output of layer k - 1, which is the input of layer k). vLLM and speculators
  use the same numbers (id k: the input of layer k). SGLang adds one to each id it is given (id
  k: the output of layer k, i.e. `hidden_states[k + 1]`). Every engine's default is
  `hidden_states` 2, N // 2 and N - 3. Index N differs everywhere (transformers applies the final
  norm there, the engines do not), so no format holds it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, PretrainedConfig


def d2t_offsets(d2t: torch.Tensor) -> torch.Tensor:
    """draftsmith's d2t (target ids, (V_d,)) -> the engines' offsets (target id - draft id)."""
    return d2t.long() - torch.arange(d2t.numel())


def d2t_from_offsets(offsets: torch.Tensor) -> torch.Tensor:
    """The engines' d2t offsets (V_d,) -> draftsmith's d2t (target ids)."""
    return offsets.long() + torch.arange(offsets.numel())


def t2d_mask(d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """draftsmith's d2t (V_d,) -> the engines' t2d: a (V,) bool mask of the drafted target ids."""
    mask = torch.zeros(vocab_size, dtype=torch.bool)
    mask[d2t.long()] = True
    return mask


def check_draft_vocab(d2t: torch.Tensor, t2d: torch.Tensor | None, vocab_size: int, where: str):
    """A d2t (target ids, (V_d,)) must name distinct ascending ids inside the target vocabulary,
    and an engine's t2d mask (when given) must mark exactly those."""
    if d2t.ndim != 1 or d2t.numel() == 0:
        raise ValueError(f"{where}: d2t must be a non-empty vector, got shape {tuple(d2t.shape)}")
    if int(d2t.min()) < 0 or int(d2t.max()) >= vocab_size:
        raise ValueError(
            f"{where}: d2t maps draft ids to target ids outside 0 .. {vocab_size - 1}: the head "
            "was made for a target with another vocabulary"
        )
    if d2t.numel() > 1 and not bool((d2t[1:] > d2t[:-1]).all()):
        raise ValueError(f"{where}: d2t does not map draft ids to distinct ascending target ids")
    if t2d is not None and not torch.equal(t2d.bool(), t2d_mask(d2t, vocab_size)):
        raise ValueError(
            f"{where}: t2d ({tuple(t2d.shape)}, {int(t2d.bool().sum())} marked) does not mark "
            f"the {d2t.numel()} target ids d2t names"
        )


def engine_layer_ids(feature_layers: list[int], num_layers: int, engine: str) -> list[int]:
    """draftsmith's feature layers (hidden_states indices) as `engine`'s aux layer ids."""
    offset = {"vllm": 0, "sglang": -1}[engine]
    lowest = -offset  # SGLang cannot name the embeddings (hidden_states[0])
    if any(not lowest <= k < num_layers for k in feature_layers):
        raise ValueError(
            f"feature layers {feature_layers} (hidden_states indices) include one the {engine} "
            f"format cannot hold: it captures hidden_states[{lowest} .. {num_layers - 1}] of a "
            f"{num_layers}-layer target (index {num_layers} is after transformers' final norm, "
            "which the engines do not apply)"
        )
    return [k + offset for k in feature_layers]


def feature_layers_from_engine(ids: list[int], num_layers: int, engine: str) -> list[int]:
    """`engine`'s aux layer ids as draftsmith's feature layers (hidden_states indices)."""
    layers = [int(i) - {"vllm": 0, "sglang": -1}[engine] for i in ids]
    if any(not 0 <= k < num_layers for k in layers):
        raise ValueError(
            f"aux hidden state layer ids {list(ids)} ({engine} numbering) do not fit a "
            f"{num_layers}-layer target"
        )
    return layers


def default_engine_feature_layers(num_layers: int) -> list[int]:
    """The feature layers every engine (and the EAGLE repository) reads when none are named."""
    return [2, num_layers // 2, num_layers - 3]


LAYER_FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "rms_norm_eps",
    "max_position_embeddings",
    "rope_parameters",
)
"""What the engines' one-layer Llama config says about the layer (the rest is bookkeeping)."""


def llama_layer_config(target_config: PretrainedConfig) -> LlamaConfig:
    """A one-layer Llama config with the target's layer sizes, norms and rotary embedding: the
    `transformer_layer_config` the engines build an EAGLE-3 layer from."""
    text = target_config.get_text_config()
    fields = {key: getattr(text, key, None) for key in LAYER_FIELDS}
    fields["head_dim"] = fields["head_dim"] or text.hidden_size // text.num_attention_heads
    return LlamaConfig(
        **{k: v for k, v in fields.items() if v is not None},
        vocab_size=text.vocab_size,
        num_hidden_layers=1,
        attention_bias=False,
        mlp_bias=False,
        tie_word_embeddings=False,
        bos_token_id=getattr(text, "bos_token_id", None),
        eos_token_id=getattr(text, "eos_token_id", None),
    )


def same_tensors(ours: dict[str, torch.Tensor], theirs: dict[str, torch.Tensor]) -> bool:
    """Whether two state dicts hold tensors of the same names and shapes."""
    return {k: tuple(v.shape) for k, v in ours.items()} == {
        k: tuple(v.shape) for k, v in theirs.items()
    }


def check_layer_config(found: dict, target_config: PretrainedConfig, where: str) -> None:
    """A foreign head's layer config must describe the layer draftsmith builds from the target."""
    expected = llama_layer_config(target_config).to_dict()
    differing = [
        f"{key} {found.get(key)!r} (target: {expected[key]!r})"
        for key in LAYER_FIELDS
        if key in found and key in expected and not _same(found[key], expected[key])
    ]
    if differing:
        raise ValueError(
            f"{where}: the head's layer differs from the target's: {', '.join(differing)}. "
            "draftsmith builds the EAGLE-3 layer from the target's own config: use a head "
            "trained for this target"
        )


def _same(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = set(a) & set(b)  # rope dicts: compare what both state
        return all(_same(a[k], b[k]) for k in keys)
    if isinstance(a, float) or isinstance(b, float):
        return a is not None and b is not None and abs(float(a) - float(b)) <= 1e-9 * abs(b)
    return a == b


def read_safetensors(folder: Path, names: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """The tensors of the first of `names` in folder, or of all its `*.safetensors` shards.

    Pickled checkpoints (`.bin`, `.pt`) are refused: loading them runs arbitrary code.
    """
    for name in names:
        if (folder / name).is_file():
            files = [folder / name]
            break
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix in (".bin", ".pt", ".pth"))
        hint = (
            f" It holds {pickled}, a pickled checkpoint, which draftsmith does not load (loading "
            'one runs arbitrary code). Convert it once where you trust it: python -c "import '
            "torch, safetensors.torch as s; s.save_file(torch.load('FILE', weights_only=True), "
            f"'{names[0]}')\""
            if pickled
            else ""
        )
        raise FileNotFoundError(f"{folder} holds no safetensors weights ({names[0]}).{hint}")
    tensors = {}
    for file in files:
        try:
            tensors.update(load_file(str(file)))
        except (SafetensorError, OSError) as error:
            raise ValueError(f"{file} is corrupt or truncated ({error})") from error
    return tensors


def write_checkpoint(out: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    """config.json and model.safetensors, as the engines load them, into folder out."""
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")

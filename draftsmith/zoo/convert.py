"""Converting a GGUF checkpoint into an ordinary transformers folder (bf16 safetensors, config,
generation config, tokenizer with its chat template)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def convert_gguf(
    gguf_path: str | Path, out_dir: str | Path, *, eos_token_ids: Sequence[int] | None = None
) -> None:
    """Convert a GGUF checkpoint into a bf16 safetensors transformers folder with its tokenizer.

    The GGUF is dequantized while loading (cast to bf16 tensor by tensor, so the fp32 copy of the
    whole model is never held), then re-wrapped in a fresh model without the GGUF quantizer,
    which `save_pretrained` refuses to serialise.

    Args:
        gguf_path: the ``.gguf`` file.
        out_dir: folder to write (created if missing).
        eos_token_ids: stop ids for the saved generation config; by default the GGUF's own eos.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    source = dict(
        pretrained_model_name_or_path=str(gguf_path.parent),
        gguf_file=gguf_path.name,
        local_files_only=True,  # per-call HF_HUB_OFFLINE: everything is on disk
    )
    logger.info("loading and dequantizing %s", gguf_path)
    tokenizer = AutoTokenizer.from_pretrained(**source)
    gguf_model = AutoModelForCausalLM.from_pretrained(
        **source, dtype=torch.bfloat16, low_cpu_mem_usage=True, **_dequantize_kwargs()
    )
    model = _rewrap(gguf_model)
    del gguf_model
    _tidy_tokenizer(tokenizer, model.config)
    if eos_token_ids:
        model.generation_config.eos_token_id = list(eos_token_ids)

    logger.info("writing bf16 safetensors and tokenizer to %s", out_dir)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    _match_permissions(out_dir)


def _rewrap(gguf_model: Any) -> Any:
    """A plain (unquantized) model holding `gguf_model`'s tensors, without copying them.

    `save_pretrained` refuses models loaded from GGUF because their config carries a
    quantization config; building the same class from the cleaned config and the state dict gives
    a model it saves normally. Passing the state dict to `from_pretrained` (rather than
    `from_config` + `load_state_dict`) skips the random init of a second full-size model.
    """
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    state = gguf_model.state_dict()
    model = type(gguf_model).from_pretrained(None, config=config, state_dict=state)
    # The GGUF carries the special token ids; keep its generation config rather than a default.
    model.generation_config = gguf_model.generation_config
    return model


def _tidy_tokenizer(tokenizer: Any, config: Any) -> None:
    """Fix what a GGUF-built tokenizer would otherwise save oddly.

    Its load kwargs (``local_files_only``) would be written into tokenizer_config.json, and the
    GGUF carries no ``model_max_length``, leaving transformers' 1e30 sentinel: use the context
    length the model was configured with, as the upstream tokenizer configs do.
    """
    tokenizer.init_kwargs.pop("local_files_only", None)
    context = getattr(config, "max_position_embeddings", None)
    if context and tokenizer.model_max_length > 1e12:
        tokenizer.model_max_length = context
        tokenizer.init_kwargs["model_max_length"] = context


def _match_permissions(folder: Path) -> None:
    """Give the weights the mode the umask gave config.json.

    safetensors writes its files 0600, which would lock a shared cache to the user who filled it.
    """
    mode = (folder / "config.json").stat().st_mode & 0o777
    for weights in folder.glob("*.safetensors"):
        weights.chmod(mode)


def _dequantize_kwargs() -> dict[str, Any]:
    """Ask for dense weights where transformers can keep GGUF blocks packed (newer releases)."""
    try:
        from transformers import GgufConfig
    except ImportError:  # older transformers always dequantize
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}
